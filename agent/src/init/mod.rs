//! PID 1 in the appliance: mounts, modules, reaping, supervisor, shutdown (DESIGN §4.1).
