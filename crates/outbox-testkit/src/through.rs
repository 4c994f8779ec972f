//! Rows put through the relay's own path, for scale tests and benchmarks: a table
//! whose sent rows were written as `sent` by an INSERT has none of the dead index
//! entries that the real claim-and-mark path leaves behind, so it would flatter
//! every claim measured on it.

use std::time::Duration;

use outbox_ports::{Lease, OutboxStore, PortError};

/// Claims every pending message in batches of `batch` and marks each batch sent,
/// with the same store calls the relay makes (`claim_pending`, then `mark_sent`
/// under the claim's lease). Returns how many were marked.
///
/// # Errors
/// The first [`PortError`] of the store; rows marked before it stay sent.
pub async fn send_all_pending(store: &dyn OutboxStore, batch: u32) -> Result<u64, PortError> {
    let run = uuid::Uuid::now_v7().simple();
    let mut marked = 0;
    for n in 0_u64.. {
        let lease = Lease::new(format!("through-{run}#{n}"), Duration::from_secs(300));
        let claimed = store.claim_pending(&lease, batch).await?;
        if claimed.is_empty() {
            break;
        }
        let ids: Vec<_> = claimed.iter().map(|c| c.message.id).collect();
        let n = store.mark_sent(&lease, &ids).await?;
        if n != ids.len() as u64 {
            return Err(PortError::fatal(
                "send all pending",
                format!("{n} of {} claimed rows marked sent", ids.len()),
            ));
        }
        marked += n;
    }
    Ok(marked)
}
