//! The whole-cluster test harness: QEMU VMs of the appliance image on one multicast segment,
//! checked from a host-side participant in a network namespace.
//!
//! - [`cluster`]: the example cluster under QEMU, its VMs, addresses and boot.
//! - [`node_plan`]: what a test cluster is made of, whoever runs it.
//! - [`vm`]: one QEMU virtual machine (overlay, config drive, NIC on the segment).
//! - [`configdrive`]: OpenStack config drives for the test VMs.
//! - [`guest`]: commands inside a stand-in node through the QEMU guest agent.
//! - [`segment`]: the test segments (QEMU multicast, a multicast-dropping bridge) and the
//!   host-side participant on each.
//! - [`netns`]: the harness's own network namespace (testkit's `Netns` and what the harness
//!   adds to it).
//! - [`neutron`]: the harness's namespace playing Neutron (DHCP, metadata) for the VMs.
//! - [`probe`]: `curl`, `dig` and a client loop through a VIP from the host-side participant.
//! - [`payload`]: the cluster's payloads as the whole-cluster runs build them.
//! - [`standin`]: the RHCOS stand-in built from Debian packages.
//! - [`openshift`]: the QEMU cluster beside `openshift-install`'s ignition configs.
//! - [`openstack`]: the cluster on a real OpenStack.
//! - [`testbed`]: what the scenarios need of a running cluster, whoever runs it.
//! - [`scenarios`]: the scenarios of `make qemu-cluster`, in order.
//! - [`day2`]: the day-2 scenarios of `make qemu-day2`.
//! - [`fabric`]: a two-rack leaf-spine BGP fabric in network namespaces.
//! - [`report`]: the closing table of a whole-cluster run.
//! - [`tools`]: the external commands the harness runs, found before anything starts.

pub mod cluster;
pub mod configdrive;
pub mod day2;
pub mod dual_stack;
pub mod fabric;
pub mod guest;
pub mod netns;
pub mod neutron;
pub mod node_plan;
pub mod openshift;
pub mod openstack;
pub mod payload;
pub mod probe;
pub mod report;
pub mod scenarios;
pub mod segment;
pub mod standin;
pub mod testbed;
pub mod tools;
pub mod vm;
