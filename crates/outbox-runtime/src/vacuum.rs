//! Vacuuming after retention rounds, shared by the relay's and the consumers'
//! retention: the mode an operator chooses and the log that tells them once what
//! the server does not do.

use outbox_ports::SpaceReclaim;
use serde::Deserialize;

/// Vacuuming after retention rounds (`vacuum` of `[retention]` and of a
/// consumer's retention).
///
/// Every claim, mark and consumed delivery leaves a dead row version, and
/// retention deletes; only `VACUUM` makes their space reusable. PostgreSQL's
/// autovacuum normally does it. With it off (for the server or for the table),
/// nothing does, and a table of a thousand live rows grows by gigabytes a day.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VacuumMode {
    /// After each round, when autovacuum is off for the table and its dead rows
    /// pass autovacuum's own threshold, vacuum it (`VACUUM (SKIP_LOCKED,
    /// ANALYZE)`); with autovacuum on, nothing. The role must own the table or
    /// the database; if it does not, a warning says so once. The check runs after
    /// retention rounds: with retention off, there is none.
    #[default]
    Auto,
    /// Never: the table's upkeep is the server's or the operator's.
    Never,
}

/// Logs what vacuuming after retention does: each vacuum at debug level, with
/// the dead rows it found and left; once, at warning level, that autovacuum is
/// off (so the operator learns the server is not looking after the table) or
/// that this role may not vacuum; errors at warning level each time.
///
/// A vacuum leaving many dead rows is not warned about: right after one, the
/// rows other sessions made dead in the last second and the ones running
/// transactions still see are counted too, so "left" alone cannot tell a held
/// horizon from a busy table.
#[derive(Debug, Default)]
pub struct VacuumLog {
    told_off: bool,
    told_not_permitted: bool,
}

impl VacuumLog {
    /// Logs one reclaim outcome of `table`.
    pub fn note(
        &mut self,
        table: &'static str,
        outcome: Result<SpaceReclaim, outbox_ports::PortError>,
    ) {
        match outcome {
            Ok(SpaceReclaim::ByTheStore) => {}
            Ok(SpaceReclaim::NotPermitted) => {
                if !std::mem::replace(&mut self.told_not_permitted, true) {
                    tracing::warn!(
                        table,
                        "autovacuum is off for this table and this role owns neither it nor the database, so it cannot vacuum it: the table grows until autovacuum is switched on or an owner vacuums it"
                    );
                }
            }
            Ok(other) => {
                if !std::mem::replace(&mut self.told_off, true) {
                    tracing::warn!(
                        table,
                        "autovacuum is off for this table: vacuuming it after retention rounds by autovacuum's threshold (vacuum = \"never\" leaves it to the operator)"
                    );
                }
                if let SpaceReclaim::Reclaimed { dead, left } = other {
                    tracing::debug!(table, dead, left, "vacuumed");
                }
            }
            Err(e) => {
                tracing::warn!(table, error = %e, "vacuum failed; trying again after the next round")
            }
        }
    }
}
