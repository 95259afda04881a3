//! The admin API's fence requests (`coordinatorctl fence list|show ID`): committed flows and
//! their history, read from the store. Read-only: nothing here starts or changes a flow.

use protocol::admin::AdminResponse;
use protocol::admin::fence::{
    FenceFlowDetail, FenceFlowStep, FenceFlowSummary, FenceRequest, FenceResponse,
};
use protocol::messages::{Refusal, RefusalCode};

use super::flow::{Flow, State};
use super::store::FenceStore;
use crate::clock::to_unix_ms;
use crate::k8s::release::Release;
use crate::store::Store;

/// Most flows one `list` returns.
pub const LIST_MAX: u32 = 1000;

/// A committed flow as the admin API shows it.
pub fn summary(f: &Flow) -> FenceFlowSummary {
    FenceFlowSummary {
        id: f.id,
        address: f.address.clone(),
        serial: f.serial.clone(),
        node: f.node.clone(),
        state: f.state.kind().to_string(),
        failure: match &f.state {
            State::Failed { detail } => detail.clone(),
            _ => f.failure.clone().unwrap_or_default(),
        },
        release: match &f.how {
            Some(Release::Taint) => "taint".into(),
            Some(Release::DeleteNode(_)) => "delete-node".into(),
            None => String::new(),
        },
        keep_off: f.keep_off,
        state_since_unix_ms: to_unix_ms(f.state_since),
        confirmed_off_unix_ms: f.confirmed_off.map(to_unix_ms),
        powered_on_unix_ms: f.powered_on.map(to_unix_ms),
    }
}

/// Answers one fence request from the store.
pub async fn handle(store: &Store, req: FenceRequest) -> AdminResponse {
    let result = match req {
        FenceRequest::List { limit } => store
            .list(limit.clamp(1, LIST_MAX))
            .await
            .map(|l| Ok(FenceResponse::List(l.iter().map(summary).collect()))),
        FenceRequest::ListFor { machine, limit } => store
            .list_for(machine, limit.clamp(1, LIST_MAX))
            .await
            .map(|l| Ok(FenceResponse::List(l.iter().map(summary).collect()))),
        FenceRequest::Show { id } => async {
            let Some(f) = store.load(id).await? else {
                return Ok(None);
            };
            Ok(Some((f, store.history(id).await?)))
        }
        .await
        .map(|r| match r {
            Some((f, h)) => Ok(FenceResponse::Show(Box::new(FenceFlowDetail {
                flow: summary(&f),
                steps: h
                    .into_iter()
                    .map(|l| FenceFlowStep {
                        at_unix_ms: to_unix_ms(l.at),
                        state: l.state,
                        event: l.event,
                    })
                    .collect(),
            }))),
            None => Err(format!(
                "no fence flow {id}; `coordinatorctl fence list` shows the flows"
            )),
        }),
    };
    match result {
        Ok(Ok(r)) => AdminResponse::Fence(r),
        Ok(Err(reason)) => AdminResponse::Error(Refusal::new(RefusalCode::BadRequest, reason)),
        Err(e) => AdminResponse::Error(Refusal::new(RefusalCode::Internal, e.to_string())),
    }
}
