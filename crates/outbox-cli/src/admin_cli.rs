//! The operator's commands, `outbox messages|consumers|dead-letters|ordering|stats`: the admin
//! API's actions on the database directly, through the same [`AdminService`], so
//! their writes are audited too (as `cli:<os user>`). Filter flags mirror the API's
//! query parameters; tables for people ([`admin_output`](crate::admin_output)),
//! `--json` for scripts.

use std::process::ExitCode;

use clap::{Args, Subcommand};
use outbox_admin::AdminService;
use outbox_admin::model::{BulkResponse, FilterBody};
use outbox_admin::params::{
    DEFAULT_LIMIT, filter_from_body, parse_cursor, parse_dead_letter_id, parse_limit, parse_max,
    parse_message_id, text,
};
use outbox_core::{InboxStatus, Lifecycle};
use outbox_ports::MessageFilter;

use crate::admin_output as out;
use crate::config::RelayConfig;

/// The list filters, as flags named like the API's query parameters.
#[derive(Debug, Clone, Default, Args, PartialEq, Eq)]
pub(crate) struct FilterArgs {
    /// Only this status: pending, sent, publish_failed, dead.
    #[arg(long)]
    status: Option<String>,
    /// Only this exchange.
    #[arg(long)]
    exchange: Option<String>,
    /// Only this routing key.
    #[arg(long)]
    routing_key: Option<String>,
    /// Only this message type.
    #[arg(long = "type")]
    message_type: Option<String>,
    /// Only messages created at or after this RFC 3339 time.
    #[arg(long)]
    created_after: Option<String>,
    /// Only messages created before this RFC 3339 time.
    #[arg(long)]
    created_before: Option<String>,
    /// A message id or a correlation id, exactly.
    #[arg(long)]
    q: Option<String>,
    /// Only this failure group, as `outbox failures` names it (an error text as
    /// stored means its group).
    #[arg(long)]
    error: Option<String>,
}

impl FilterArgs {
    fn body(&self) -> FilterBody {
        FilterBody {
            status: self.status.clone(),
            exchange: self.exchange.clone(),
            routing_key: self.routing_key.clone(),
            message_type: self.message_type.clone(),
            created_after: self.created_after.clone(),
            created_before: self.created_before.clone(),
            q: self.q.clone(),
            error: self.error.clone(),
        }
    }

    /// The filter of outbox messages, and the filter as JSON for the audit log (as
    /// the API records it).
    fn parse(&self) -> anyhow::Result<(MessageFilter, String)> {
        self.parse_on()
    }

    /// The filter on the side `S` (its status names), and the filter as JSON.
    fn parse_on<S: Lifecycle>(&self) -> anyhow::Result<(MessageFilter<S>, String)> {
        let body = self.body();
        let filter = filter_from_body(&body)?;
        Ok((filter, serde_json::to_string(&body)?))
    }
}

/// A page position and size.
#[derive(Debug, Args)]
pub(crate) struct PageArgs {
    /// Page size, 1 to 1000.
    #[arg(long, default_value_t = DEFAULT_LIMIT)]
    limit: u32,
    /// Where the previous page ended (its `next_cursor`).
    #[arg(long)]
    cursor: Option<String>,
}

impl PageArgs {
    fn parse(&self) -> anyhow::Result<(Option<outbox_ports::PageCursor>, u32)> {
        let limit = parse_limit(Some(&self.limit.to_string()))?;
        Ok((parse_cursor(self.cursor.as_deref())?, limit))
    }
}

/// One message by id, or every message matching the filter flags.
#[derive(Debug, Args)]
pub(crate) struct Target {
    /// The message.
    #[arg(required_unless_present = "filter", conflicts_with = "filter")]
    id: Option<String>,
    /// Act on every message matching the filter flags (server-side, in batches).
    #[arg(long)]
    filter: bool,
    #[command(flatten)]
    flags: FilterArgs,
    /// With --filter: count what matches, change nothing.
    #[arg(long, requires = "filter")]
    dry_run: bool,
    /// With --filter: at most this many (default 10000).
    #[arg(long, requires = "filter")]
    max: Option<u64>,
    /// Print the outcome as JSON.
    #[arg(long)]
    json: bool,
}

/// `outbox messages ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum MessagesAction {
    /// List messages, newest first.
    #[command(
        after_help = "Examples:\n  outbox messages list --status dead --exchange orders --limit 50\n  outbox messages list --q 0190f0a2-7c3e-7a41-9b2d-3c4e5f607182"
    )]
    List {
        #[command(flatten)]
        filter: FilterArgs,
        #[command(flatten)]
        page: PageArgs,
        /// Oldest first (as `sort=oldest`); newest first without it.
        #[arg(long)]
        oldest_first: bool,
        /// Print the page as JSON (as `GET /api/v1/messages`).
        #[arg(long)]
        json: bool,
    },
    /// Show one message with its publish side and every consumer's side.
    #[command(
        after_help = "Examples:\n  outbox messages show 0190f0a2-7c3e-7a41-9b2d-3c4e5f607182 --json"
    )]
    Show {
        /// The message.
        id: String,
        /// Print it as JSON (as `GET /api/v1/messages/{id}`).
        #[arg(long)]
        json: bool,
    },
    /// Put dead or failed messages back to pending with a fresh retry budget.
    #[command(
        after_help = "Examples:\n  outbox messages requeue 0190f0a2-7c3e-7a41-9b2d-3c4e5f607182\n  outbox messages requeue --filter --status dead --exchange orders --dry-run"
    )]
    Requeue(Target),
    /// Make a delayed (scheduled) message due now: published at the next claim.
    #[command(
        after_help = "Examples:\n  outbox messages publish-now 0190f0a2-7c3e-7a41-9b2d-3c4e5f607182"
    )]
    PublishNow {
        /// The message.
        id: String,
    },
    /// Replay a dead message as a new one, its payload or headers edited (needs
    /// `[admin] allow_edit = true`); the original stays dead, marked replayed.
    #[command(
        after_help = "Examples:\n  outbox messages replay 0190f0a2-7c3e-7a41-9b2d-3c4e5f607182 --payload-file fixed.json\n  outbox messages replay 0190f0a2-7c3e-7a41-9b2d-3c4e5f607182 --header x-fixed=yes --drop-header x-bad"
    )]
    Replay {
        /// The dead message.
        id: String,
        #[command(flatten)]
        edit: ReplayFlags,
    },
    /// Delete dead messages (pending and failed ones too with --force).
    #[command(
        after_help = "Examples:\n  outbox messages delete 0190f0a2-7c3e-7a41-9b2d-3c4e5f607182\n  outbox messages delete --filter --status dead --dry-run"
    )]
    Delete {
        #[command(flatten)]
        target: Target,
        /// Also delete pending or failed messages that no relay holds.
        #[arg(long)]
        force: bool,
    },
}

/// How `... replay` edits what it replays.
#[derive(Debug, Args)]
pub(crate) struct ReplayFlags {
    /// The new payload, read from this file (`-`: standard input); without it, the
    /// original's.
    #[arg(long, value_name = "FILE")]
    payload_file: Option<std::path::PathBuf>,
    /// Sets a header (NAME=VALUE), on top of the original's; repeatable.
    #[arg(long = "header", value_name = "NAME=VALUE")]
    headers: Vec<String>,
    /// Leaves a header of the original's out; repeatable.
    #[arg(long = "drop-header", value_name = "NAME")]
    drop_headers: Vec<String>,
    /// Print the answer as JSON (as the API's replay answers).
    #[arg(long)]
    json: bool,
}

/// `outbox consumers ...`.
#[derive(Debug, Subcommand)]
#[allow(clippy::large_enum_variant)] // Parsed once per run; boxing buys nothing.
pub(crate) enum ConsumersAction {
    /// Every consumer with its counts.
    #[command(after_help = "Examples:\n  outbox consumers list --json")]
    List {
        /// Print them as JSON.
        #[arg(long)]
        json: bool,
    },
    /// One consumer's deliveries, newest first; --status takes received, consumed,
    /// consume_failed, dead (`outbox dead list --consumer` was this, with dead).
    #[command(after_help = "Examples:\n  outbox consumers deliveries billing --status dead")]
    Deliveries {
        /// The consumer.
        consumer: String,
        #[command(flatten)]
        filter: FilterArgs,
        #[command(flatten)]
        page: PageArgs,
        /// Oldest first (as `sort=oldest`); newest first without it.
        #[arg(long)]
        oldest_first: bool,
        /// Print the page as JSON (as `GET /api/v1/consumers/{name}/deliveries`).
        #[arg(long)]
        json: bool,
    },
    /// Run a consumer's handler again for one delivery (a dead or consume_failed
    /// one; a consumed one only with --again), or with --filter for its failed and
    /// dead deliveries matching the filter flags (consumed ones only with
    /// `--status consumed`); --status takes received, consumed, consume_failed,
    /// dead. A delivery a worker or a retry holds right now is refused.
    #[command(
        after_help = "Examples:\n  outbox consumers reconsume billing 0190f0a2-7c3e-7a41-9b2d-3c4e5f607182\n  outbox consumers reconsume billing --filter --status dead --dry-run"
    )]
    Reconsume {
        /// The consumer.
        consumer: String,
        /// With an id: reconsume it even if it was consumed (runs its handler once
        /// more); without, a consumed delivery is refused.
        #[arg(long, conflicts_with = "filter")]
        again: bool,
        #[command(flatten)]
        target: Target,
    },
    /// Replay a dead delivery as a new one, its payload or headers edited (needs
    /// `[admin] allow_edit = true`): the consumer's retry sweep runs its handler;
    /// the original stays dead, marked replayed.
    #[command(
        after_help = "Examples:\n  outbox consumers replay billing 0190f0a2-7c3e-7a41-9b2d-3c4e5f607182 --payload-file fixed.json"
    )]
    Replay {
        /// The consumer.
        consumer: String,
        /// The dead delivery (its message id).
        id: String,
        #[command(flatten)]
        edit: ReplayFlags,
    },
}

/// `outbox dead-letters ...`: deliveries a consumer could not decode (no message
/// id, undecodable, oversized), kept with their raw body and headers.
#[derive(Debug, Subcommand)]
pub(crate) enum DeadLettersAction {
    /// List dead letters, newest first.
    #[command(after_help = "Examples:\n  outbox dead-letters list --consumer billing")]
    List {
        /// Only this consumer's.
        #[arg(long)]
        consumer: Option<String>,
        #[command(flatten)]
        page: PageArgs,
        /// Print the page as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show one dead letter with its whole body.
    #[command(after_help = "Examples:\n  outbox dead-letters show 42")]
    Show {
        /// The dead letter's id (a number).
        id: String,
        /// Print it as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Delete one dead letter.
    #[command(after_help = "Examples:\n  outbox dead-letters delete 42")]
    Delete {
        /// The dead letter's id (a number).
        id: String,
    },
}

/// Who the audit log names for a command run here: `cli:<os user>` (`$USER`, else
/// `$LOGNAME`, else the uid).
#[must_use]
pub fn cli_actor() -> String {
    let user = ["USER", "LOGNAME"]
        .into_iter()
        .find_map(|v| std::env::var(v).ok().filter(|u| !u.trim().is_empty()))
        .or_else(uid)
        .unwrap_or_else(|| "unknown".to_owned());
    format!("cli:{user}")
}

#[cfg(unix)]
fn uid() -> Option<String> {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata("/proc/self")
        .ok()
        .map(|m| format!("uid={}", m.uid()))
}

#[cfg(not(unix))]
fn uid() -> Option<String> {
    None
}

/// The admin service over the configured PostgreSQL stores, showing the relay's
/// sweep report in `stats`.
///
/// # Errors
/// An unreachable store, failed migrations.
pub(crate) async fn service(cfg: &RelayConfig) -> anyhow::Result<AdminService> {
    Ok(wired_service(cfg).await?.0)
}

/// [`service`] reading the throughput log too, for `outbox throughput`.
pub(crate) async fn service_with_throughput(cfg: &RelayConfig) -> anyhow::Result<AdminService> {
    let (service, throughput) = wired_service(cfg).await?;
    Ok(service.with_throughput(throughput))
}

/// The operator's admin service and the throughput log of the same wiring.
async fn wired_service(
    cfg: &RelayConfig,
) -> anyhow::Result<(
    AdminService,
    std::sync::Arc<dyn outbox_ports::ThroughputLog>,
)> {
    let wired = crate::wiring::wire(cfg, "outbox-cli").await?;
    crate::wiring::migrate_if_asked(cfg, wired.postgres.as_ref()).await?;
    let service = cfg
        .admin
        .service(wired.admin, wired.state, vec![cfg.sweep.state_key.clone()]);
    Ok((service, wired.throughput))
}

/// `outbox throughput`: every exchange's and consumer's totals over `window`, or
/// one's (`place`) bucket by bucket.
///
/// # Errors
/// A name no exchange or consumer can have; what the log says.
pub(crate) async fn throughput(
    service: &AdminService,
    place: Option<(outbox_ports::PauseKind, String)>,
    window: outbox_ports::ChartWindow,
    json: bool,
) -> anyhow::Result<ExitCode> {
    match place {
        None => {
            let totals = service.throughput_totals(window).await?;
            out::either(json, &totals, out::throughput_totals)?;
        }
        Some((outbox_ports::PauseKind::Exchange, name)) => {
            let t = service.exchange_throughput(&name, window).await?;
            out::either(json, &t, out::exchange_throughput)?;
        }
        Some((_, name)) => {
            let t = service.consumer_throughput(&name, window).await?;
            out::either(json, &t, out::consumer_throughput)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn bulk_done(
    verb: &str,
    dry_run: bool,
    max: u64,
    outcome: &BulkResponse,
    json: bool,
) -> anyhow::Result<()> {
    if json {
        out::json(outcome)
    } else if dry_run {
        // The count is exact; --max bounds only what one run changes.
        let bounded = if outcome.matched > max {
            format!(" (at most {max} in one run: --max)")
        } else {
            String::new()
        };
        out::line(&format!(
            "dry run: {} message(s) match; would {verb} those in a status it applies to{bounded}",
            outcome.matched
        ));
        Ok(())
    } else {
        out::line(&format!(
            "{verb}: {} of {} matching message(s) changed",
            outcome.changed, outcome.matched
        ));
        Ok(())
    }
}

impl ReplayFlags {
    fn changes_headers(&self) -> bool {
        !self.headers.is_empty() || !self.drop_headers.is_empty()
    }

    /// The edit these flags ask for: the payload from a file (or none: the
    /// original's), and when headers change, the original's as `shown` (a hidden
    /// one as `***`, which the service puts back) with the changes.
    fn edit(
        &self,
        shown: Option<std::collections::BTreeMap<String, String>>,
    ) -> anyhow::Result<outbox_admin::model::ReplayRequest> {
        let payload = match &self.payload_file {
            None => None,
            Some(path) if path.as_os_str() == "-" => {
                let mut text = String::new();
                std::io::Read::read_to_string(&mut std::io::stdin(), &mut text).map_err(|e| {
                    anyhow::anyhow!("--payload-file -: cannot read standard input: {e}")
                })?;
                Some(text)
            }
            Some(path) => Some(
                std::fs::read_to_string(path)
                    .map_err(|e| anyhow::anyhow!("--payload-file {}: {e}", path.display()))?,
            ),
        };
        let headers = match shown {
            None => None,
            Some(mut headers) => {
                for name in &self.drop_headers {
                    if headers.remove(name).is_none() {
                        anyhow::bail!("--drop-header {name}: the original has no such header");
                    }
                }
                for pair in &self.headers {
                    let Some((name, value)) = pair.split_once('=') else {
                        anyhow::bail!("--header {pair}: expected NAME=VALUE");
                    };
                    headers.insert(name.to_owned(), value.to_owned());
                }
                Some(headers)
            }
        };
        Ok(outbox_admin::model::ReplayRequest { payload, headers })
    }
}

/// Runs `outbox messages ...`.
///
/// # Errors
/// Bad input (naming it), what the store says.
pub(crate) async fn messages(
    service: &AdminService,
    action: MessagesAction,
) -> anyhow::Result<ExitCode> {
    let actor = cli_actor();
    match action {
        MessagesAction::List {
            filter,
            page,
            oldest_first,
            json,
        } => {
            let (filter, _) = filter.parse()?;
            let filter = MessageFilter {
                oldest_first,
                ..filter
            };
            let (cursor, limit) = page.parse()?;
            let page = service.list_messages(&filter, cursor, limit).await?;
            out::either(json, &page, out::message_page)?;
        }
        MessagesAction::Show { id, json } => {
            let detail = service.get_message(parse_message_id(&id)?).await?;
            out::either(json, &detail, out::message_detail)?;
        }
        MessagesAction::PublishNow { id } => {
            let id = parse_message_id(&id)?;
            service.publish_now(&actor, id).await?;
            out::line(&format!(
                "due now: {id} is published at the relay's next claim"
            ));
        }
        MessagesAction::Replay { id, edit: flags } => {
            let id = parse_message_id(&id)?;
            let shown = if flags.changes_headers() {
                Some(service.get_message(id).await?.headers)
            } else {
                None
            };
            let edit = flags.edit(shown)?;
            let made = service.replay_message(&actor, id, edit).await?;
            out::either(flags.json, &made, |m| {
                out::line(&format!(
                    "replayed {} as {} (pending; the original stays dead, marked replayed)",
                    m.replayed_from, m.id
                ));
            })?;
        }
        MessagesAction::Requeue(t) => {
            if let Some(id) = one(&t)? {
                service.requeue_message(&actor, id).await?;
                out::line(&format!("requeued {id}"));
            } else {
                let (filter, target) = t.flags.parse()?;
                let bar = out::BulkBar::new(out::shows_progress(t.json, t.dry_run), "requeued");
                let outcome = service
                    .requeue_matching_with_progress(
                        &actor,
                        &filter,
                        target,
                        t.dry_run,
                        parse_max(t.max)?,
                        &mut |p| bar.update(p),
                    )
                    .await;
                bar.finish();
                bulk_done("requeue", t.dry_run, parse_max(t.max)?, &outcome?, t.json)?;
            }
        }
        MessagesAction::Delete { target: t, force } => {
            if let Some(id) = one(&t)? {
                service.delete_message(&actor, id, force).await?;
                out::line(&format!("deleted {id}"));
            } else {
                let (filter, target) = t.flags.parse()?;
                let bar = out::BulkBar::new(out::shows_progress(t.json, t.dry_run), "deleted");
                let outcome = service
                    .delete_matching_with_progress(
                        &actor,
                        &filter,
                        target,
                        t.dry_run,
                        parse_max(t.max)?,
                        force,
                        &mut |p| bar.update(p),
                    )
                    .await;
                bar.finish();
                let outcome = outcome?;
                bulk_done("delete", t.dry_run, parse_max(t.max)?, &outcome, t.json)?;
                if !force && !t.dry_run && outcome.changed < outcome.matched {
                    eprintln!(
                        "note: only dead messages are deleted; pending and failed ones need --force"
                    );
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The id of a single-message action; filter flags belong to `--filter`.
fn one(t: &Target) -> anyhow::Result<Option<outbox_core::MessageId>> {
    match &t.id {
        Some(id) => {
            if t.flags != FilterArgs::default() {
                anyhow::bail!("filter flags act only with --filter (and then without an id)");
            }
            Ok(Some(parse_message_id(id)?))
        }
        None => Ok(None),
    }
}

/// Runs `outbox consumers ...`.
///
/// # Errors
/// What the store says.
pub(crate) async fn consumers(
    service: &AdminService,
    action: ConsumersAction,
) -> anyhow::Result<ExitCode> {
    match action {
        ConsumersAction::List { json } => {
            let consumers = service.consumers().await?;
            if json {
                out::json(&outbox_admin::model::ConsumerList { items: consumers })?;
            } else {
                out::consumers(&consumers);
            }
        }
        ConsumersAction::Deliveries {
            consumer,
            filter,
            page,
            oldest_first,
            json,
        } => {
            let (filter, _) = filter.parse_on::<InboxStatus>()?;
            let filter = outbox_ports::DeliveryFilter {
                oldest_first,
                ..filter
            };
            let (cursor, limit) = page.parse()?;
            let page = service
                .list_deliveries(&consumer, &filter, cursor, limit)
                .await?;
            out::either(json, &page, out::message_page)?;
        }
        ConsumersAction::Replay {
            consumer,
            id,
            edit: flags,
        } => {
            let id = parse_message_id(&id)?;
            let shown = if flags.changes_headers() {
                Some(service.get_delivery(&consumer, id).await?.headers)
            } else {
                None
            };
            let edit = flags.edit(shown)?;
            let made = service
                .replay_delivery(&cli_actor(), &consumer, id, edit)
                .await?;
            out::either(flags.json, &made, |m| {
                out::line(&format!(
                    "replayed {} of {consumer} as {} (handled at its next retry sweep; the original stays dead, marked replayed)",
                    m.replayed_from, m.id
                ));
            })?;
        }
        ConsumersAction::Reconsume {
            consumer,
            again,
            target: t,
        } => {
            let actor = cli_actor();
            if let Some(id) = one(&t)? {
                service.reconsume(&actor, &consumer, id, again).await?;
                out::line(&format!(
                    "reconsume {id} for {consumer}: queued for its consume sweep"
                ));
            } else {
                let (filter, target) = t.flags.parse_on::<InboxStatus>()?;
                let bar = out::BulkBar::new(out::shows_progress(t.json, t.dry_run), "reconsumed");
                let outcome = service
                    .reconsume_matching_with_progress(
                        &actor,
                        &consumer,
                        &filter,
                        target,
                        t.dry_run,
                        parse_max(t.max)?,
                        &mut |p| bar.update(p),
                    )
                    .await;
                bar.finish();
                bulk_done("reconsume", t.dry_run, parse_max(t.max)?, &outcome?, t.json)?;
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs `outbox dead-letters ...`.
///
/// # Errors
/// Bad input, what the store says.
pub(crate) async fn dead_letters(
    service: &AdminService,
    action: DeadLettersAction,
) -> anyhow::Result<ExitCode> {
    match action {
        DeadLettersAction::List {
            consumer,
            page,
            json,
        } => {
            let (cursor, limit) = page.parse()?;
            let page = service.list_dead_letters(consumer, cursor, limit).await?;
            out::either(json, &page, out::dead_letter_page)?;
        }
        DeadLettersAction::Show { id, json } => {
            let letter = service.get_dead_letter(parse_dead_letter_id(&id)?).await?;
            out::either(json, &letter, out::dead_letter_detail)?;
        }
        DeadLettersAction::Delete { id } => {
            let id = parse_dead_letter_id(&id)?;
            service.delete_dead_letter(&cli_actor(), id).await?;
            out::line(&format!("deleted dead letter {id}"));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `outbox ordering ...`: per-key ordering.
#[derive(Debug, Subcommand)]
pub(crate) enum OrderingAction {
    /// List the ordering keys held back by a failing or (unless skipped) dead head,
    /// by key: the head's id, status, attempts, retry time and last error, and how
    /// many messages wait behind it (requeue or delete the head with `outbox
    /// messages requeue|delete ID`).
    #[command(after_help = "Examples:\n  outbox ordering blocked --limit 20 --after customer-7")]
    Blocked {
        /// Page size, 1 to 1000.
        #[arg(long, default_value_t = DEFAULT_LIMIT)]
        limit: u32,
        /// Only keys after this one (the previous page's last key).
        #[arg(long)]
        after: Option<String>,
        /// Print the page as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Runs `outbox ordering ...`.
///
/// # Errors
/// Bad input, what the store says.
pub(crate) async fn ordering(
    service: &AdminService,
    action: OrderingAction,
) -> anyhow::Result<ExitCode> {
    match action {
        OrderingAction::Blocked { limit, after, json } => {
            let limit = parse_limit(Some(&limit.to_string()))?;
            let after = after.map(|a| text("after", a)).transpose()?;
            let page = service.blocked_keys(after, limit).await?;
            out::either(json, &page, out::blocked_key_page)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs `outbox failures`.
///
/// # Errors
/// What the stores say.
pub(crate) async fn failures(service: &AdminService, json: bool) -> anyhow::Result<ExitCode> {
    let groups = service.failure_groups().await?;
    out::either(json, &groups, out::failure_groups)?;
    Ok(ExitCode::SUCCESS)
}

/// Runs `outbox pause KIND NAME` (`pause`) or `outbox resume KIND NAME`; says on
/// stderr what changed, and the answer's warning (an exchange no unsent message
/// carries).
///
/// # Errors
/// A name that cannot be paused, what the stores say.
pub(crate) async fn pause(
    service: &AdminService,
    kind: outbox_ports::PauseKind,
    name: &str,
    pause: bool,
) -> anyhow::Result<ExitCode> {
    let name = text("name", name.to_owned())?;
    let actor = cli_actor();
    let state = if pause {
        service.pause(&actor, kind, &name).await?
    } else {
        service.resume(&actor, kind, &name).await?
    };
    let shown = out::printable(&name);
    match (state.paused, state.changed) {
        (true, true) => eprintln!("paused {kind} {shown}"),
        (true, false) => eprintln!("{kind} {shown} was paused already"),
        (false, true) => eprintln!("resumed {kind} {shown}"),
        (false, false) => eprintln!("{kind} {shown} was not paused"),
    }
    if let Some(warning) = &state.warning {
        eprintln!("warning: {}", out::printable(warning));
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs `outbox pauses`.
///
/// # Errors
/// What the store says.
pub(crate) async fn pauses(service: &AdminService, json: bool) -> anyhow::Result<ExitCode> {
    let pauses = service.pauses().await?;
    out::either(json, &pauses, out::pause_list)?;
    Ok(ExitCode::SUCCESS)
}

/// A failure group, as `outbox failures` names it.
#[derive(Debug, clap::Args)]
pub(crate) struct GroupArgs {
    /// The group's error, as `outbox failures` prints it.
    #[arg(long)]
    error: String,
    /// Count what the group holds, change nothing.
    #[arg(long)]
    dry_run: bool,
    /// At most this many (default 10000).
    #[arg(long)]
    max: Option<u64>,
    /// Print the outcome as JSON.
    #[arg(long)]
    json: bool,
}

/// `outbox failures requeue|delete|reconsume`.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum FailuresAction {
    /// Requeue the failing and dead messages of one exchange's group.
    #[command(
        after_help = "Examples:\n  outbox failures requeue --exchange orders --error \"order <n> rejected\" --dry-run"
    )]
    Requeue {
        /// The group's exchange.
        #[arg(long)]
        exchange: String,
        #[command(flatten)]
        group: GroupArgs,
    },
    /// Delete the dead messages of one exchange's group (its failing ones stay).
    #[command(
        after_help = "Examples:\n  outbox failures delete --exchange orders --error \"order <n> rejected\""
    )]
    Delete {
        /// The group's exchange.
        #[arg(long)]
        exchange: String,
        #[command(flatten)]
        group: GroupArgs,
    },
    /// Run the handler again for the failing and dead deliveries of one
    /// consumer's group.
    #[command(
        after_help = "Examples:\n  outbox failures reconsume --consumer billing --error \"row <n> of invoices is locked\""
    )]
    Reconsume {
        /// The group's consumer.
        #[arg(long)]
        consumer: String,
        #[command(flatten)]
        group: GroupArgs,
    },
}

/// Runs `outbox failures requeue|delete|reconsume ...`.
///
/// # Errors
/// Bad input, a group that holds nothing, what the stores say.
pub(crate) async fn failure_group(
    service: &AdminService,
    action: FailuresAction,
) -> anyhow::Result<ExitCode> {
    let actor = cli_actor();
    let (verb, place, g) = match &action {
        FailuresAction::Requeue { exchange, group } => ("requeue", exchange, group),
        FailuresAction::Delete { exchange, group } => ("delete", exchange, group),
        FailuresAction::Reconsume { consumer, group } => ("reconsume", consumer, group),
    };
    let place = text("name", place.clone())?;
    let error = text("error", g.error.clone())?;
    let max = parse_max(g.max)?;
    let outcome = match &action {
        FailuresAction::Requeue { .. } => {
            service
                .requeue_failure_group(&actor, &place, &error, g.dry_run, max)
                .await?
        }
        FailuresAction::Delete { .. } => {
            service
                .delete_failure_group(&actor, &place, &error, g.dry_run, max)
                .await?
        }
        FailuresAction::Reconsume { .. } => {
            service
                .reconsume_failure_group(&actor, &place, &error, g.dry_run, max)
                .await?
        }
    };
    bulk_done(verb, g.dry_run, max, &outcome, g.json)?;
    Ok(ExitCode::SUCCESS)
}

/// Runs `outbox stats`.
///
/// # Errors
/// What the stores say.
pub(crate) async fn stats(service: &AdminService, json: bool) -> anyhow::Result<ExitCode> {
    let stats = service.stats().await?;
    out::either(json, &stats, out::stats)?;
    Ok(ExitCode::SUCCESS)
}

/// A consumer's dead letters, for `outbox dead list --consumer NAME`, marked so.
///
/// # Errors
/// What the store says.
pub(crate) async fn consumer_dead_letters(
    service: &AdminService,
    consumer: &str,
    limit: u32,
) -> anyhow::Result<usize> {
    let page = service
        .list_dead_letters(
            Some(consumer.to_owned()),
            None,
            outbox_ports::page_limit(limit),
        )
        .await?;
    out::marked_dead_letters(&page.items);
    Ok(page.items.len())
}
