//! The :22623/:22624 Ignition config service on a node (shares code with `keelson serve`).
