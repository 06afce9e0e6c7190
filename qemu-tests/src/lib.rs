//! The whole-cluster test harness: QEMU VMs of the appliance image on one multicast segment,
//! checked from a host-side participant in a network namespace.

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
