//! The status endpoint (unix socket) and Prometheus metrics.
