//! Asking a gateway which machines it has a BMC for ([`ServedQuery`]), for `coordinator
//! check`: the coordinator's own routing (racks, machine lists) says which gateway a machine
//! goes to, but only the gateway knows whether it has a `[[bmc]]` for it. A gateway from
//! before the query resets the stream, which is said as such; nothing is acted on.

use std::time::Duration;

use protocol::frame;
use protocol::gateway::{ServedMachines, ServedQuery};
use protocol::transport;

/// The machines the gateway on `conn` serves, or why that is not known.
pub(super) async fn ask(conn: &quinn::Connection, wait: Duration) -> Result<Vec<String>, String> {
    let work = async {
        let (mut send, mut recv) = conn.open_bi().await?;
        transport::write_msg(&mut send, &ServedQuery::default(), frame::MAX_FRAME_LEN).await?;
        let _ = send.finish();
        transport::expect_msg::<ServedMachines>(&mut recv, frame::MAX_FRAME_LEN).await
    };
    match tokio::time::timeout(wait, work).await {
        Ok(Ok(m)) => Ok(m.machines),
        Ok(Err(e)) => Err(format!(
            "it did not answer which machines it serves ({e}): a gateway of a release from \
             before this question resets it; upgrade it to have its [[bmc]] tables compared \
             with the inventory"
        )),
        Err(_) => Err(format!(
            "it did not say which machines it serves within {}",
            protocol::duration::display(wait)
        )),
    }
}
