//! Networking: netlink (links, addresses, routes) and the DHCPv4 client.
