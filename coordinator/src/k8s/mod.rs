//! Kubernetes: node mapping, cordon, drain, release and restore, node view, events.
