//! Health checks whose results move VRRP priorities (DESIGN §4.3).
