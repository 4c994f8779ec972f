//! Vacuuming the outbox's tables when the server will not.
//!
//! Every claim and mark rewrites an outbox row, every consumed delivery rewrites an
//! inbox row, and retention deletes: each leaves a dead row version that only
//! `VACUUM` makes reusable. With autovacuum on (PostgreSQL's default) the server
//! does it. With it off, for the server or for the table, nothing does: a table
//! with about a thousand live rows grew to 1.1 GB in a one-hour soak, and its
//! claims slowed with it. So the relay and the consumer check, after their
//! retention rounds, and vacuum the table themselves by autovacuum's own rule
//! (dead rows over `autovacuum_vacuum_threshold` plus
//! `autovacuum_vacuum_scale_factor` of the live ones).
//!
//! `SKIP_LOCKED`: several relays share a table; when one is vacuuming it, the
//! others skip instead of queueing behind it. A vacuum's own lock conflicts only
//! with other maintenance and with DDL (an `ALTER TABLE` of a migration waits for
//! it, and unlike autovacuum a manual vacuum does not give way; the outbox table's
//! vacuums are short, since retention keeps it small). One step does block reads
//! and writes, as autovacuum's does: when the table ends in empty pages (which
//! retention's deletes leave), the vacuum truncates them under an ACCESS EXCLUSIVE
//! lock, taken only if it is free at once and given up as soon as anyone waits
//! for it, so claims, marks and inserts stall for moments at most. Kept: it is
//! what shrinks the table's file after a backlog.
//!
//! Left alone: a vacuum's throttling (`vacuum_cost_delay`, 0 for a manual one), its
//! parallel index workers, and cancelling a running vacuum at shutdown.

use outbox_ports::{PortError, SpaceReclaim};
use sqlx::{PgConnection, PgPool};

use crate::PgSchema;
use crate::error::port;

/// What the server says about one table, read in one statement.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TableUpkeep {
    /// `autovacuum` is on for the server.
    pub(crate) autovacuum: bool,
    /// `track_counts` is on: without it the dead rows are not counted, and
    /// autovacuum does not run either.
    pub(crate) track_counts: bool,
    /// The table's own `autovacuum_enabled` storage parameter, when set.
    pub(crate) table_autovacuum: Option<bool>,
    /// This role may vacuum the table (it owns it, or is a superuser).
    pub(crate) may_vacuum: bool,
    pub(crate) dead: u64,
    pub(crate) live: u64,
    pub(crate) base_threshold: u64,
    pub(crate) scale_factor: f64,
}

/// What to do about a table.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Plan {
    /// The server vacuums it.
    LeaveToServer,
    /// Ours to vacuum, but this role may not.
    NotPermitted,
    /// Ours to vacuum, not yet.
    Wait { dead: u64, threshold: u64 },
    /// Vacuum now.
    Vacuum { dead: u64 },
}

/// Autovacuum's rule, applied when autovacuum will not apply it.
pub(crate) fn plan(t: &TableUpkeep) -> Plan {
    let server_does_it = t.autovacuum && t.track_counts && t.table_autovacuum != Some(false);
    if server_does_it {
        return Plan::LeaveToServer;
    }
    if !t.may_vacuum {
        return Plan::NotPermitted;
    }
    if !t.track_counts {
        // Nothing counts the dead rows: vacuum every time (a vacuum of a table
        // with little dead is cheap; it skips pages all-visible already).
        return Plan::Vacuum { dead: t.dead };
    }
    // As autovacuum computes it (float, then truncated), saturating on absurd settings.
    let threshold = (t.base_threshold as f64 + t.scale_factor.max(0.0) * t.live as f64) as u64;
    if t.dead > threshold {
        Plan::Vacuum { dead: t.dead }
    } else {
        Plan::Wait {
            dead: t.dead,
            threshold,
        }
    }
}

/// The table's own `autovacuum_vacuum_threshold` and `_scale_factor` (the
/// migrations set the scale factor to 0.01) win over the server's, as they do for
/// autovacuum; the live rows are `reltuples`, autovacuum's figure (-1 before the
/// first ANALYZE: none). Owner: the table's owner (or a member of its role, or a
/// superuser) and the database's owner may vacuum it, in PostgreSQL 15 as long
/// before; PostgreSQL 17's MAINTAIN privilege (and `pg_maintain`) is not read, so
/// a role vacuuming by that grant alone is told it may not.
const READ_UPKEEP: &str = "\
SELECT current_setting('autovacuum')::bool, \
       current_setting('track_counts')::bool, \
       (SELECT o.option_value::bool FROM pg_options_to_table(c.reloptions) o \
         WHERE o.option_name = 'autovacuum_enabled'), \
       pg_has_role(c.relowner, 'USAGE') \
         OR pg_has_role((SELECT d.datdba FROM pg_database d \
                          WHERE d.datname = current_database()), 'USAGE'), \
       pg_stat_get_dead_tuples(c.oid), \
       greatest(c.reltuples, 0)::float8, \
       (SELECT o.option_value FROM pg_options_to_table(c.reloptions) o \
         WHERE o.option_name = 'autovacuum_vacuum_threshold'), \
       current_setting('autovacuum_vacuum_threshold')::bigint, \
       (SELECT o.option_value FROM pg_options_to_table(c.reloptions) o \
         WHERE o.option_name = 'autovacuum_vacuum_scale_factor'), \
       current_setting('autovacuum_vacuum_scale_factor')::float8 \
FROM pg_class c WHERE c.oid = to_regclass($1)";

/// A table's integer storage parameter as PostgreSQL accepted it (its
/// `parse_int`, `strtol` with base 0, then `strtod` and `rint`): decimal, `0x`
/// hexadecimal, a leading `0` for octal, or a number with a fraction or exponent,
/// rounded half to even. Text cast to `bigint` in SQL would refuse some of these
/// and fail every round; anything not read here falls back to the server's
/// setting.
fn reloption_int(text: &str) -> Option<i64> {
    let t = text.trim();
    let (negative, digits) = match t.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, t.strip_prefix('+').unwrap_or(t)),
    };
    let integer = if let Some(hex) = digits
        .strip_prefix("0x")
        .or_else(|| digits.strip_prefix("0X"))
    {
        i64::from_str_radix(hex, 16).ok()
    } else if digits.len() > 1 && digits.starts_with('0') {
        i64::from_str_radix(&digits[1..], 8).ok()
    } else {
        digits.parse::<i64>().ok()
    };
    integer
        .filter(|_| !digits.starts_with(['+', '-']))
        .map(|v| if negative { -v } else { v })
        .or_else(|| {
            t.parse::<f64>()
                .ok()
                .filter(|f| f.is_finite())
                .map(|f| f.round_ties_even() as i64)
        })
}

/// Reads the table's upkeep; `table` is one of this crate's own table names.
pub(crate) async fn read(
    conn: &mut PgConnection,
    schema: &PgSchema,
    table: &'static str,
) -> Result<TableUpkeep, PortError> {
    type Row = (
        bool,
        bool,
        Option<bool>,
        bool,
        i64,
        f64,
        Option<String>,
        i64,
        Option<String>,
        f64,
    );
    let row: Option<Row> = sqlx::query_as(READ_UPKEEP)
        .bind(format!("{}.{table}", schema.quoted()))
        .fetch_optional(&mut *conn)
        .await
        .map_err(|e| port("vacuum", e))?;
    let Some((
        autovacuum,
        track_counts,
        table_autovacuum,
        may_vacuum,
        dead,
        live,
        table_base,
        server_base,
        table_scale,
        server_scale,
    )) = row
    else {
        return Err(PortError::transient(
            "vacuum",
            format!(
                "table {}.{table} not found (run the migrations)",
                schema.as_str()
            ),
        ));
    };
    let n = |v: i64| u64::try_from(v).unwrap_or(0);
    Ok(TableUpkeep {
        autovacuum,
        track_counts,
        table_autovacuum,
        may_vacuum,
        dead: n(dead),
        // Whole rows; `reltuples` is an estimate, never negative here.
        live: live as u64,
        base_threshold: n(table_base
            .as_deref()
            .and_then(reloption_int)
            .unwrap_or(server_base)),
        scale_factor: table_scale
            .as_deref()
            .and_then(|t| t.trim().parse::<f64>().ok())
            .filter(|f| f.is_finite())
            .unwrap_or(server_scale),
    })
}

/// Vacuums `schema.table` if that falls to us and enough of it is dead.
///
/// On a connection of `pool`'s taken out of it for good, with a bound of its
/// own: a vacuum takes as long as the table needs, and a pool bounded for the
/// relay's short statements (`SessionBounds`) would cancel it on every round, so
/// the table would never be vacuumed. [`VACUUM_BOUND`] still ends one that waits
/// without end (`SKIP_LOCKED` skips a table another session locks, but a vacuum
/// also waits for pins on the pages it cleans, which no `lock_timeout` bounds).
/// The connection is closed afterwards, also when this future is dropped half way
/// (the server then ends the vacuum within `client_connection_check_interval`):
/// an unbounded session never goes back into the pool (the pool opens a new one
/// when it needs it; this runs once per retention round).
pub(crate) async fn reclaim(
    pool: &PgPool,
    schema: &PgSchema,
    table: &'static str,
) -> Result<SpaceReclaim, PortError> {
    let mut conn = pool
        .acquire()
        .await
        .map_err(|e| port("vacuum", e))?
        .detach();
    // The SET runs under the pool's own bound: one far below a millisecond's
    // scheduling delay (a busy host) may cancel even it, so it is tried a few
    // times before the round gives up.
    let raise = format!("SET statement_timeout = '{}s'", VACUUM_BOUND.as_secs());
    let mut tries = 0;
    loop {
        match sqlx::query(sqlx::AssertSqlSafe(&*raise))
            .execute(&mut conn)
            .await
        {
            Ok(_) => break,
            Err(e) => {
                tries += 1;
                if tries >= 5 {
                    return Err(port("vacuum", e));
                }
            }
        }
    }
    // PostgreSQL 14 and later notice a client gone in the middle of a statement
    // (a relay that stopped, this future dropped); older servers refuse the
    // setting and end the vacuum at its bound instead.
    let _ = sqlx::query("SET client_connection_check_interval = '5s'")
        .execute(&mut conn)
        .await;
    let result = reclaim_on(&mut conn, schema, table).await;
    let _ = sqlx::Connection::close(conn).await;
    result
}

/// How long one vacuum of a retention round may take.
pub(crate) const VACUUM_BOUND: std::time::Duration = std::time::Duration::from_secs(3600);

async fn reclaim_on(
    conn: &mut PgConnection,
    schema: &PgSchema,
    table: &'static str,
) -> Result<SpaceReclaim, PortError> {
    let upkeep = read(&mut *conn, schema, table).await?;
    match plan(&upkeep) {
        Plan::LeaveToServer => Ok(SpaceReclaim::ByTheStore),
        Plan::NotPermitted => Ok(SpaceReclaim::NotPermitted),
        Plan::Wait { dead, threshold } => Ok(SpaceReclaim::NotYet { dead, threshold }),
        Plan::Vacuum { dead } => {
            // ANALYZE too: autoanalyze is off with autovacuum, and the claims'
            // plans depend on current statistics. The schema is validated and
            // quoted; the table name is this crate's constant.
            // A table another session is vacuuming is skipped with a WARNING
            // notice (logged by the client at warning level); the dead rows read
            // after it say so too.
            // One statement, not a transaction block (a vacuum cannot run in one), not
            // kept prepared (it runs once a round on a connection closed after it).
            let vacuum = format!("VACUUM (SKIP_LOCKED, ANALYZE) {}.{table}", schema.quoted());
            sqlx::query(sqlx::AssertSqlSafe(vacuum))
                .persistent(false)
                .execute(&mut *conn)
                .await
                .map_err(|e| port("vacuum", e))?;
            // What is dead still: a vacuum that reclaims little (another session
            // was vacuuming, `SKIP_LOCKED`; rows still seen by running
            // transactions; an old transaction or replication slot holding the
            // horizon back) shows here.
            let left = read(&mut *conn, schema, table)
                .await
                .map_err(|e| {
                    PortError::transient(
                        "read the table after its vacuum",
                        format!("the vacuum ran; reading what it left failed: {e}"),
                    )
                })?
                .dead;
            Ok(SpaceReclaim::Reclaimed { dead, left })
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn upkeep() -> TableUpkeep {
        TableUpkeep {
            autovacuum: false,
            track_counts: true,
            table_autovacuum: None,
            may_vacuum: true,
            dead: 0,
            live: 1000,
            base_threshold: 50,
            scale_factor: 0.2,
        }
    }

    #[test]
    fn the_server_vacuums_when_autovacuum_is_on_for_server_and_table() {
        for table_autovacuum in [None, Some(true)] {
            let t = TableUpkeep {
                autovacuum: true,
                table_autovacuum,
                dead: 1_000_000,
                ..upkeep()
            };
            assert_eq!(plan(&t), Plan::LeaveToServer);
        }
    }

    #[test]
    fn off_for_the_table_alone_falls_to_us() {
        let t = TableUpkeep {
            autovacuum: true,
            table_autovacuum: Some(false),
            dead: 251,
            ..upkeep()
        };
        assert_eq!(plan(&t), Plan::Vacuum { dead: 251 });
    }

    #[test]
    fn autovacuums_threshold_decides_when() {
        // 50 + 0.2 * 1000 = 250: at it, wait; over it, vacuum.
        let at = TableUpkeep {
            dead: 250,
            ..upkeep()
        };
        assert_eq!(
            plan(&at),
            Plan::Wait {
                dead: 250,
                threshold: 250
            }
        );
        let over = TableUpkeep {
            dead: 251,
            ..upkeep()
        };
        assert_eq!(plan(&over), Plan::Vacuum { dead: 251 });
    }

    #[test]
    fn without_counts_vacuum_every_time() {
        let t = TableUpkeep {
            autovacuum: true,
            track_counts: false,
            ..upkeep()
        };
        assert_eq!(plan(&t), Plan::Vacuum { dead: 0 });
    }

    #[test]
    fn integer_storage_parameters_read_as_postgresql_accepted_them() {
        assert_eq!(reloption_int("50"), Some(50));
        assert_eq!(reloption_int(" 7 "), Some(7));
        assert_eq!(reloption_int("0x40"), Some(64));
        assert_eq!(reloption_int("1e3"), Some(1000));
        assert_eq!(reloption_int("010"), Some(8), "octal, as strtol reads it");
        assert_eq!(reloption_int("-010"), Some(-8));
        assert_eq!(reloption_int("50.5"), Some(50), "rint: half to even");
        assert_eq!(reloption_int("51.5"), Some(52));
        assert_eq!(
            reloption_int("010.5"),
            Some(10),
            "a fraction is read as decimal"
        );
        assert_eq!(reloption_int("many"), None);
    }

    #[test]
    fn a_role_that_may_not_vacuum_says_so() {
        let t = TableUpkeep {
            may_vacuum: false,
            dead: 1_000_000,
            ..upkeep()
        };
        assert_eq!(plan(&t), Plan::NotPermitted);
    }

    proptest! {
        /// Whatever the figures: the server's job is never done twice; ours is
        /// done exactly when the dead rows pass the threshold, which grows with
        /// the live rows.
        #[test]
        fn the_plan_follows_the_rule(
            autovacuum: bool, track_counts: bool, table_autovacuum: Option<bool>,
            may_vacuum: bool, dead in 0u64..10_000_000, live in 0u64..10_000_000,
            base in 0u64..1_000_000, scale in 0.0f64..2.0,
        ) {
            let t = TableUpkeep {
                autovacuum, track_counts, table_autovacuum, may_vacuum, dead, live,
                base_threshold: base, scale_factor: scale,
            };
            let ours = !(autovacuum && track_counts && table_autovacuum != Some(false));
            match plan(&t) {
                Plan::LeaveToServer => prop_assert!(!ours),
                Plan::NotPermitted => prop_assert!(ours && !may_vacuum),
                Plan::Wait { dead: d, threshold } => {
                    prop_assert!(ours && may_vacuum && track_counts);
                    prop_assert_eq!(d, dead);
                    prop_assert!(dead <= threshold);
                    prop_assert!(threshold >= base);
                }
                Plan::Vacuum { dead: d } => {
                    prop_assert!(ours && may_vacuum);
                    prop_assert_eq!(d, dead);
                    prop_assert!(!track_counts || dead > base);
                }
            }
        }
    }
}
