//! VRRP (RFC 5798 v3, RFC 3768 v2): codecs, state machine, sockets, GARP / unsolicited NA.
