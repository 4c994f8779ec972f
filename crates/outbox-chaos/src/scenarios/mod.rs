//! The scenarios of the fault suite, one file each.
//!
//! A scenario is an `async fn(&Ctx) -> anyhow::Result<Report>`: it makes its own
//! [`World`] (the relay and the billing consumer as processes, over tables and
//! queues of its own), injects one kind of fault while orders stream in, and hands
//! over to [`conclude`] to wait for quiescence and count: nothing lost, nothing
//! twice, the dead it provokes and no other. Its own checks add to the report's
//! failures and notes. A scenario that stops a service first makes sure it is the
//! local one and starts it again even when it fails.
//!
//! To add one: a file `name.rs` here with a `//!` line on the fault it injects and
//! what it checks, a `mod` and a `pub(crate) use` line below, and an entry in
//! `SCENARIOS` in `main.rs` (whether `--quick` runs it); helpers that two or more
//! scenarios use go to [`support`], the others stay in their scenario's file; and
//! a row in the table of RELIABILITY.md.
//!
//! [`World`]: crate::world::World
//! [`conclude`]: crate::conclude

mod bad_config;
mod bad_rows;
mod broker_restart;
mod cluster_node_kill;
mod exchange_lost;
mod handler_db_faults;
mod inbox_outage_quorum;
mod lease_lost;
mod network_blackhole;
mod ordered;
mod pause_resume;
mod pg_lock_stall;
mod poison;
mod postgres_faults;
mod racing;
mod redis_outage;
mod relay_kill;
mod slow_network;
mod support;

pub(crate) use bad_config::bad_config;
pub(crate) use bad_rows::bad_rows;
pub(crate) use broker_restart::broker_restart;
pub(crate) use cluster_node_kill::cluster_node_kill;
pub(crate) use exchange_lost::exchange_lost;
pub(crate) use handler_db_faults::handler_db_faults;
pub(crate) use inbox_outage_quorum::inbox_outage_quorum;
pub(crate) use lease_lost::lease_lost;
pub(crate) use network_blackhole::network_blackhole;
pub(crate) use ordered::ordered;
pub(crate) use pause_resume::pause_resume;
pub(crate) use pg_lock_stall::pg_lock_stall;
pub(crate) use poison::poison;
pub(crate) use postgres_faults::postgres_faults;
pub(crate) use racing::racing;
pub(crate) use redis_outage::redis_outage;
pub(crate) use relay_kill::relay_kill;
pub(crate) use slow_network::slow_network;
