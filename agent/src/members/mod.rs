//! Member discovery: who is in the cluster, with which address and role (DESIGN §4.6).
