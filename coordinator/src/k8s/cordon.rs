//! Whose cordon it is: the annotation Fleetmend puts on a Node it cordons, so that it only
//! ever uncordons its own cordons and the node view can say which cordons are ours.
//!
//! Shared by [`super::drain`] (which writes and removes the mark) and [`super::view`]
//! (which reads it); it does no I/O.

use k8s_openapi::api::core::v1::Node;

/// Annotation marking a cordon as Fleetmend's. A node that is unschedulable without it was
/// cordoned by someone else and is never uncordoned by Fleetmend.
pub const CORDON_ANNOTATION: &str = "fleetmend.io/cordoned-by";

/// Value of [`CORDON_ANNOTATION`].
pub const CORDON_OWNER: &str = "fleetmend-coordinator";

/// True when `node` carries Fleetmend's cordon mark.
pub fn cordoned_by_us(node: &Node) -> bool {
    node.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CORDON_ANNOTATION))
        .is_some_and(|v| v == CORDON_OWNER)
}
