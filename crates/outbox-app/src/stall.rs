//! The relay's progress watchdog: readiness fails while work is due and no claim or
//! mark completes (a relay waiting on a lock another session holds, a store that
//! answers nothing), and clears by itself when work moves again.

use std::time::Duration;

/// `[health] stall_after` by default: far above a healthy claim or mark, which take
/// milliseconds, and above the default `lock_timeout` (10 s), so one lock waited on
/// and given up does not turn readiness red on its own.
pub const DEFAULT_STALL_AFTER: Duration = Duration::from_secs(60);
