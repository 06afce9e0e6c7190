//! OpenStack metadata: config drive and the HTTP metadata service, behind one trait (DESIGN §4.2).
