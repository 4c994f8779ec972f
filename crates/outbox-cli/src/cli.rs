//! The `outbox` command line: `run`, `migrate`, `dead ...`, the operator's
//! commands (`messages`, `consumers`, `dead-letters`, `stats`: [`crate::admin_cli`])
//! and `demo`.

use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use outbox_core::{InboxStatus, MessageId, OutboxStatus};
use outbox_ports::{OutboxStore, PortError};
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

use crate::admin_cli::{self, ConsumersAction, DeadLettersAction, MessagesAction, OrderingAction};
use crate::config::{CoordinationKind, RelayConfig, StoreKind};
use crate::demo::{self, DemoOptions};
use crate::{http, wiring};
use outbox_relay::{DispatcherConfig, LeaseFactory, RelayBuilder};

/// Transactional outbox, idempotent inbox and retry relay for RabbitMQ.
#[derive(Debug, Parser)]
#[command(
    name = "outbox",
    version,
    about = "Transactional outbox, idempotent inbox and retry relay for RabbitMQ"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the relay: dispatcher, publish-retry sweep and HTTP endpoints, until
    /// SIGINT or SIGTERM.
    #[command(
        after_help = "Examples:\n  outbox run --config outbox.toml\n  OUTBOX__POSTGRES__URL=postgres://app@db/shop outbox run"
    )]
    Run(ConfigArg),
    /// Create or update the PostgreSQL tables of the configured schema.
    #[command(after_help = "Examples:\n  outbox migrate --config outbox.toml")]
    Migrate(ConfigArg),
    /// Dead messages (deprecated spellings, kept for one release: `messages list
    /// --status dead`, `messages requeue`, `messages delete`, `consumers deliveries
    /// <name> --status dead`, `consumers reconsume <name> <id>`).
    #[command(after_help = "Examples:\n  outbox dead list --limit 20\n  outbox dead requeue --all")]
    Dead {
        #[command(flatten)]
        config: ConfigArg,
        #[command(subcommand)]
        action: DeadAction,
    },
    /// Browse, requeue and delete outbox messages (audited as `cli:<user>`).
    #[command(
        after_help = "Examples:\n  outbox messages list --status dead --exchange orders\n  outbox messages requeue --filter --status dead --dry-run"
    )]
    Messages {
        #[command(flatten)]
        config: ConfigArg,
        #[command(subcommand)]
        action: MessagesAction,
    },
    /// Consumers with their counts.
    #[command(
        after_help = "Examples:\n  outbox consumers list\n  outbox consumers deliveries billing --status dead"
    )]
    Consumers {
        #[command(flatten)]
        config: ConfigArg,
        #[command(subcommand)]
        action: ConsumersAction,
    },
    /// Deliveries a consumer could not decode, kept raw.
    #[command(
        after_help = "Examples:\n  outbox dead-letters list --consumer billing\n  outbox dead-letters show 42 --json"
    )]
    DeadLetters {
        #[command(flatten)]
        config: ConfigArg,
        #[command(subcommand)]
        action: DeadLettersAction,
    },
    /// Per-key ordering: the keys held back by a failing or dead head.
    #[command(after_help = "Examples:\n  outbox ordering blocked --limit 20")]
    Ordering {
        #[command(flatten)]
        config: ConfigArg,
        #[command(subcommand)]
        action: OrderingAction,
    },
    /// Failing and dead messages and deliveries grouped by their error (ids,
    /// numbers and quoted values taken out), per exchange and per consumer, the
    /// largest groups first; or an action on one group (audited).
    #[command(args_conflicts_with_subcommands = true)]
    #[command(
        after_help = "Examples:\n  outbox failures\n  outbox failures requeue --exchange orders --error \"order <n> rejected\" --dry-run"
    )]
    Failures {
        #[command(flatten)]
        config: ConfigArg,
        /// Print them as JSON.
        #[arg(long)]
        json: bool,
        #[command(subcommand)]
        action: Option<admin_cli::FailuresAction>,
    },
    /// Pause an exchange (the relays hold its messages pending, each ordering
    /// key's order kept) or a consumer (its workers finish what they hold and take
    /// no more). Relays obey at their next claim, consumers within a second once
    /// what they hold is handled; a restart keeps it. Audited.
    #[command(
        after_help = "Examples:\n  outbox pause exchange orders\n  outbox pause consumer billing"
    )]
    Pause {
        #[command(flatten)]
        config: ConfigArg,
        /// `exchange` or `consumer`.
        kind: PauseKindArg,
        /// Its name.
        name: String,
    },
    /// Lift a pause set by `outbox pause`. Audited.
    #[command(
        after_help = "Examples:\n  outbox resume exchange orders\n  outbox resume consumer billing"
    )]
    Resume {
        #[command(flatten)]
        config: ConfigArg,
        /// `exchange` or `consumer`.
        kind: PauseKindArg,
        /// Its name.
        name: String,
    },
    /// The pauses in force: kind, name, since, by whom.
    #[command(after_help = "Examples:\n  outbox pauses\n  outbox pauses --json")]
    Pauses {
        #[command(flatten)]
        config: ConfigArg,
        /// Print them as JSON.
        #[arg(long)]
        json: bool,
    },
    /// What each exchange published and each consumer consumed over the last hour,
    /// day or week, with failed attempts; or one exchange's or consumer's, bucket
    /// by bucket (a minute, 15 minutes, an hour). From the totals every relay and
    /// worker adds every few seconds.
    #[command(
        after_help = "Examples:\n  outbox throughput\n  outbox throughput --window 24h\n  outbox throughput exchange orders --window 7d --json"
    )]
    Throughput {
        #[command(flatten)]
        config: ConfigArg,
        /// `exchange` or `consumer`: only that one, bucket by bucket.
        #[arg(requires = "name")]
        kind: Option<PauseKindArg>,
        /// Its name.
        name: Option<String>,
        /// `1h`, `24h` or `7d`.
        #[arg(long, default_value = "1h", value_parser = chart_window)]
        window: outbox_ports::ChartWindow,
        /// Print it as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Counts by status, last hour's throughput and the last sweep report.
    #[command(after_help = "Examples:\n  outbox stats\n  outbox stats --json")]
    Stats {
        #[command(flatten)]
        config: ConfigArg,
        /// Print them as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Run the whole flow on in-memory adapters with injected faults, and print a
    /// one-line summary.
    #[command(
        after_help = "Examples:\n  outbox demo\n  outbox demo --poison 3 --dead-publish 2 --serve"
    )]
    Demo(DemoArgs),
}

/// A chart's window as `--window` names it.
fn chart_window(value: &str) -> Result<outbox_ports::ChartWindow, String> {
    outbox_ports::ChartWindow::parse(value).ok_or_else(|| "expected 1h, 24h or 7d".to_owned())
}

/// What `outbox pause` and `outbox resume` act on.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub(crate) enum PauseKindArg {
    /// An exchange the relays publish to.
    Exchange,
    /// A consumer (its name in the inbox).
    Consumer,
}

impl From<PauseKindArg> for outbox_ports::PauseKind {
    fn from(kind: PauseKindArg) -> Self {
        match kind {
            PauseKindArg::Exchange => Self::Exchange,
            PauseKindArg::Consumer => Self::Consumer,
        }
    }
}

#[derive(Debug, Args)]
struct ConfigArg {
    /// Configuration file (TOML); `OUTBOX__SECTION__KEY` variables override it.
    #[arg(long, short, default_value = "outbox.toml", global = true)]
    config: PathBuf,
}

#[derive(Debug, Subcommand)]
enum DeadAction {
    /// List dead messages, oldest first (publish side, or with `--consumer` that
    /// consumer's dead deliveries and its dead letters, marked `dead-letter`).
    #[command(
        after_help = "Examples:\n  outbox dead list --limit 20\n  outbox dead list --consumer billing"
    )]
    List {
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// List this consumer's dead deliveries and dead letters (from the
        /// PostgreSQL inbox) instead.
        #[arg(long)]
        consumer: Option<String>,
    },
    /// Run a consumer's handler again for a consumed, failed or dead delivery (its
    /// consume sweep picks it up with a fresh retry budget).
    #[command(
        after_help = "Examples:\n  outbox dead reconsume 0190f0a2-7c3e-7a41-9b2d-3c4e5f607182 --consumer billing"
    )]
    Reconsume {
        /// The message.
        id: String,
        /// The consumer.
        #[arg(long)]
        consumer: String,
    },
    /// Put dead messages back to pending with a fresh retry budget.
    #[command(
        after_help = "Examples:\n  outbox dead requeue 0190f0a2-7c3e-7a41-9b2d-3c4e5f607182\n  outbox dead requeue --all"
    )]
    Requeue {
        /// The message to requeue.
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        id: Option<String>,
        /// Requeue every dead message.
        #[arg(long)]
        all: bool,
    },
    /// Delete a dead message for good.
    #[command(after_help = "Examples:\n  outbox dead delete 0190f0a2-7c3e-7a41-9b2d-3c4e5f607182")]
    Delete {
        /// The message to delete.
        id: String,
    },
}

#[derive(Debug, Args)]
struct DemoArgs {
    /// Messages to enqueue.
    #[arg(long, default_value_t = 1000)]
    messages: u64,
    /// Publishes that fail as on a lost connection.
    #[arg(long, default_value_t = 50)]
    publish_failures: u64,
    /// Publishes the broker nacks.
    #[arg(long, default_value_t = 20)]
    nacks: u64,
    /// Publishes the broker returns as unroutable.
    #[arg(long, default_value_t = 10)]
    returns: u64,
    /// Share of messages whose handler fails on its first attempt.
    #[arg(long, default_value_t = 0.05)]
    handler_failure_rate: f64,
    /// Acknowledgements lost, so the broker delivers those messages twice.
    #[arg(long, default_value_t = 25)]
    redeliveries: u64,
    /// Messages whose handler always fails; they end dead.
    #[arg(long, default_value_t = 0)]
    poison: u64,
    /// Messages to an exchange that does not exist: their publishes fail until
    /// they end dead (with --serve, try requeue and delete on them).
    #[arg(long, default_value_t = 0)]
    dead_publish: u64,
    /// Seed of the random choices.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Give up after this long (e.g. 60s).
    #[arg(long, default_value = "60s", value_parser = outbox_core::duration::parse)]
    timeout: Duration,
    /// Hide the progress bar.
    #[arg(long)]
    quiet: bool,
    /// After the flow, keep the in-memory stores, the relay and the consumer
    /// running and serve the dashboard on loopback until Ctrl-C (what you requeue
    /// there is published and handled again); prints one line with a one-time
    /// login URL.
    #[arg(long)]
    serve: bool,
    /// Where `--serve` listens (loopback only; port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:8080", requires = "serve")]
    serve_address: std::net::SocketAddr,
}

fn init_logging(default: &str) {
    // lapin logs every returned message with its body at WARN: payloads stay out of
    // the logs (we report returns as failures ourselves).
    let default = format!("{default},lapin::returned_messages=error");
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}

/// Exit code of a configuration error.
const CONFIG_ERROR: u8 = 2;

/// Parses the arguments, runs the command, and returns the process's exit code.
#[must_use]
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(dispatch(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("{}", error_text(&e));
            ExitCode::FAILURE
        }
    }
}

/// A command's error as printed: its chain, with what a message or the store put
/// in it (a header, a handler's error text) unable to drive the terminal:
/// control characters escaped, line breaks and tabs kept.
fn error_text(e: &anyhow::Error) -> String {
    format!(
        "error: {}",
        crate::admin_output::printable_text(&format!("{e:#}"))
    )
}

fn load(path: &std::path::Path) -> Result<RelayConfig, ExitCode> {
    RelayConfig::load(path).map_err(|e| {
        eprintln!(
            "error: {}",
            crate::admin_output::printable_text(&e.to_string())
        );
        ExitCode::from(CONFIG_ERROR)
    })
}

/// A configuration whose store outlives the process: the operator's commands work
/// on it directly.
fn load_persistent(path: &std::path::Path) -> Result<RelayConfig, ExitCode> {
    let cfg = load(path)?;
    if cfg.adapters.store == StoreKind::Memory {
        eprintln!(
            "error: invalid configuration `adapters.store`: this command needs a persistent store (memory has none to inspect)"
        );
        return Err(ExitCode::from(CONFIG_ERROR));
    }
    Ok(cfg)
}

/// The admin service of an operator's command, or the exit code of a bad config.
async fn operator(
    config: &ConfigArg,
) -> anyhow::Result<Result<outbox_admin::AdminService, ExitCode>> {
    init_logging("warn");
    match load_persistent(&config.config) {
        Ok(cfg) => Ok(Ok(admin_cli::service(&cfg).await?)),
        Err(code) => Ok(Err(code)),
    }
}

async fn dispatch(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Demo(a) => run_demo(a).await,
        Command::Run(c) => {
            // The configuration first: it says how to log ([log]) and where spans
            // go ([telemetry]). Its errors are printed, not logged.
            let cfg = match load(&c.config) {
                Ok(cfg) => cfg,
                Err(code) => return Ok(code),
            };
            let telemetry = match crate::logging::init("info", &cfg.log, &cfg.telemetry) {
                Ok(t) => t,
                Err(e) => {
                    eprintln!("error: invalid configuration `telemetry.otlp_endpoint`: {e}");
                    return Ok(ExitCode::from(CONFIG_ERROR));
                }
            };
            if telemetry.exporting() {
                tracing::info!("exporting spans over OTLP");
            }
            let code = run_relay(cfg).await;
            // Spans still buffered go out before the process ends (SIGTERM too).
            telemetry.shutdown().await;
            code
        }
        Command::Migrate(c) => {
            init_logging("info");
            let cfg = match load(&c.config) {
                Ok(cfg) => cfg,
                Err(code) => return Ok(code),
            };
            let Some((pool, schema)) = wiring::postgres(&cfg).await? else {
                eprintln!(
                    "error: invalid configuration `postgres.url`: migrate needs a [postgres] section"
                );
                return Ok(ExitCode::from(CONFIG_ERROR));
            };
            outbox_adapters_postgres::migrate(&pool, &schema).await?;
            eprintln!("migrated schema {schema}");
            Ok(ExitCode::SUCCESS)
        }
        Command::Messages { config, action } => match operator(&config).await? {
            Ok(service) => admin_cli::messages(&service, action).await,
            Err(code) => Ok(code),
        },
        Command::Consumers { config, action } => match operator(&config).await? {
            Ok(service) => admin_cli::consumers(&service, action).await,
            Err(code) => Ok(code),
        },
        Command::DeadLetters { config, action } => match operator(&config).await? {
            Ok(service) => admin_cli::dead_letters(&service, action).await,
            Err(code) => Ok(code),
        },
        Command::Ordering { config, action } => match operator(&config).await? {
            Ok(service) => admin_cli::ordering(&service, action).await,
            Err(code) => Ok(code),
        },
        Command::Failures {
            config,
            json,
            action,
        } => match operator(&config).await? {
            Ok(service) => match action {
                None => admin_cli::failures(&service, json).await,
                Some(action) => admin_cli::failure_group(&service, action).await,
            },
            Err(code) => Ok(code),
        },
        Command::Pause { config, kind, name } => match operator(&config).await? {
            Ok(service) => admin_cli::pause(&service, kind.into(), &name, true).await,
            Err(code) => Ok(code),
        },
        Command::Resume { config, kind, name } => match operator(&config).await? {
            Ok(service) => admin_cli::pause(&service, kind.into(), &name, false).await,
            Err(code) => Ok(code),
        },
        Command::Pauses { config, json } => match operator(&config).await? {
            Ok(service) => admin_cli::pauses(&service, json).await,
            Err(code) => Ok(code),
        },
        Command::Throughput {
            config,
            kind,
            name,
            window,
            json,
        } => {
            init_logging("warn");
            let cfg = match load_persistent(&config.config) {
                Ok(cfg) => cfg,
                Err(code) => return Ok(code),
            };
            let service = admin_cli::service_with_throughput(&cfg).await?;
            let place = kind.map(outbox_ports::PauseKind::from).zip(name);
            admin_cli::throughput(&service, place, window, json).await
        }
        Command::Stats { config, json } => {
            init_logging("warn");
            let cfg = match load_persistent(&config.config) {
                Ok(cfg) => cfg,
                Err(code) => return Ok(code),
            };
            // The per-minute totals from the throughput log `outbox run` records,
            // as its dashboard and /api/v1/stats read them: one source, one number.
            let service = admin_cli::service_with_throughput(&cfg).await?;
            admin_cli::stats(&service, json).await
        }
        Command::Dead { config, action } => {
            init_logging("warn");
            let cfg = match load_persistent(&config.config) {
                Ok(cfg) => cfg,
                Err(code) => return Ok(code),
            };
            match action {
                DeadAction::List {
                    consumer: Some(consumer),
                    limit,
                } => consumer_dead(&cfg, &consumer, None, limit).await,
                DeadAction::Reconsume { id, consumer } => {
                    consumer_dead(&cfg, &consumer, Some(id), 0).await
                }
                action => {
                    let wired = wiring::wire(&cfg, "outbox-cli").await?;
                    wiring::migrate_if_asked(&cfg, wired.postgres.as_ref()).await?;
                    let service = cfg.admin.service(
                        wired.admin.clone(),
                        wired.state.clone(),
                        vec![cfg.sweep.state_key.clone()],
                    );
                    dead(&*wired.store, &*wired.admin.outbox, &service, action).await
                }
            }
        }
    }
}

#[allow(clippy::print_stdout)]
async fn run_demo(a: DemoArgs) -> anyhow::Result<ExitCode> {
    init_logging("warn");
    let opts = DemoOptions {
        messages: a.messages,
        publish_failures: a.publish_failures,
        nacks: a.nacks,
        returns: a.returns,
        handler_failure_rate: a.handler_failure_rate,
        redeliveries: a.redeliveries,
        poison: a.poison,
        dead_publish: a.dead_publish,
        seed: a.seed,
        timeout: a.timeout,
        progress: !a.quiet,
    };
    if let Err(usage) = opts.check() {
        eprintln!("error: {usage}");
        return Ok(ExitCode::from(2));
    }
    let (s, world, flow) = demo::run_keeping(&opts).await.context("demo failed")?;
    // Without --serve the flow stops here; with it, it runs while the dashboard
    // is served, so an operator's requeue is published and handled again.
    let flow = if a.serve {
        Some(flow)
    } else {
        flow.stop().await?;
        None
    };
    eprintln!(
        "demo: {} publish failures and {} handler failures retried; {} redeliveries absorbed by the inbox; {} duplicate effects; {} sweeps",
        s.publish_failures,
        s.consume_failures,
        s.duplicates_absorbed,
        s.duplicate_effects,
        s.sweeps
    );
    println!("{s}");
    if a.serve {
        let cancel = CancellationToken::new();
        let stop = cancel.clone();
        tokio::spawn(async move {
            shutdown_signal().await;
            stop.cancel();
        });
        crate::demo_serve::serve(
            &world,
            a.serve_address,
            |url| println!("dashboard: open {url} (one-time login; Ctrl-C stops)"),
            cancel,
        )
        .await?;
    }
    if let Some(flow) = flow {
        flow.stop().await?;
    }
    Ok(if s.lost == 0 && s.duplicate_effects == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

async fn shutdown_signal() {
    outbox_app::shutdown_signal().await;
}

/// Fails fast on what no retry can fix (a wrong password, a wrong host) before
/// anything is written; the relay would otherwise spend every message's attempts on
/// it. What needs no schema is checked first, then the migrations run (if asked),
/// then what lives in the schema.
async fn start_checks(
    cfg: &RelayConfig,
    wired: &wiring::Wired,
    probe_key: &str,
) -> anyhow::Result<()> {
    let lock_in_postgres = cfg.adapters.lock == CoordinationKind::Postgres;
    let lock_unless = async |skip: bool| {
        if skip {
            Ok(())
        } else {
            http::check_lock(&*wired.lock, probe_key).await
        }
    };
    let mut failed = failures([
        ("broker", http::check_broker(&*wired.publisher).await),
        ("lock", lock_unless(lock_in_postgres).await),
    ]);
    if failed.is_empty() {
        wiring::migrate_if_asked(cfg, wired.postgres.as_ref()).await?;
        failed = failures([
            ("store", http::check_store(&*wired.store).await),
            ("lock", lock_unless(!lock_in_postgres).await),
        ]);
    }
    if failed.is_empty() {
        Ok(())
    } else {
        anyhow::bail!("cannot start: {}", failed.join("; "))
    }
}

/// Declares `[[topology.*]]` on RabbitMQ (idempotent); a declaration the broker
/// refuses, such as a queue that exists with other arguments, stops start-up with
/// the broker's reply naming it.
async fn declare_topology(cfg: &RelayConfig) -> anyhow::Result<()> {
    if cfg.topology.is_empty() {
        return Ok(());
    }
    let topology = cfg.topology.to_topology()?;
    let r = cfg
        .rabbitmq
        .as_ref()
        .context("topology needs the [rabbitmq] section")?;
    let tls = r
        .tls()
        .map_err(|e| anyhow::anyhow!("cannot start: topology: {e}"))?;
    let connection =
        outbox_adapters_rabbitmq::connect_any(&r.nodes(), &tls, Duration::from_secs(10))
            .await
            .map_err(|e| anyhow::anyhow!("cannot start: topology: {e}"))?;
    let declared = topology.declare(&connection).await;
    let _ = connection.close(200, "topology declared".into()).await;
    let declared = declared.map_err(|e| anyhow::anyhow!("cannot start: topology: {e}"))?;
    for queue in &declared.unavailable_queues {
        tracing::warn!(%queue, "topology: the queue's home node is down; starting without it (only its routes wait for the node)");
    }
    tracing::info!(
        exchanges = topology.exchanges.len(),
        queues = topology.queues.len(),
        bindings = topology.bindings.len(),
        "topology declared"
    );
    Ok(())
}

/// The depths of the topology's queues (`[[topology.queues]]`, shards expanded)
/// as the broker reports them, for the dashboard and `/api/v1/stats`; `None`
/// without a topology or a broker section.
fn queue_depths(cfg: &RelayConfig) -> Option<std::sync::Arc<dyn outbox_ports::QueueDepths>> {
    if cfg.topology.is_empty() {
        return None;
    }
    let topology = cfg.topology.to_topology().ok()?.expanded();
    let r = cfg.rabbitmq.as_ref()?;
    let queues: Vec<String> = topology.queues.iter().map(|q| q.name.clone()).collect();
    if queues.is_empty() {
        return None;
    }
    let tls = match r.tls() {
        Ok(tls) => tls,
        Err(e) => {
            // The relay itself stops on it at connect; the dashboard says nothing.
            tracing::warn!(error = %e, "queue depths not shown: [rabbitmq] TLS settings unusable");
            return None;
        }
    };
    Some(std::sync::Arc::new(
        outbox_adapters_rabbitmq::RabbitQueueDepths::new(r.nodes(), tls, queues),
    ))
}

/// `name: error` of every failed check.
fn failures<const N: usize>(checks: [(&str, Result<(), String>); N]) -> Vec<String> {
    checks
        .into_iter()
        .filter_map(|(name, r)| r.err().map(|e| format!("{name}: {e}")))
        .collect()
}

async fn run_relay(cfg: RelayConfig) -> anyhow::Result<ExitCode> {
    for (section, settings) in crate::settings_log::settings_lines(&cfg) {
        tracing::info!("[{section}] {settings}");
    }
    // The HTTP address first: a taken one stops the relay before it connects to
    // anything or publishes a message.
    let listener = if cfg.http.enabled {
        match tokio::net::TcpListener::bind(cfg.http.address).await {
            Ok(l) => Some(l),
            Err(e) => {
                let address = cfg.http.address;
                tracing::error!(%address, error = %e, "cannot bind the HTTP address; stopping");
                eprintln!("error: cannot serve HTTP on {address}: {e}");
                return Ok(ExitCode::FAILURE);
            }
        }
    } else {
        None
    };
    let instance = cfg
        .instance
        .clone()
        .unwrap_or_else(|| LeaseFactory::instance_id("relay"));
    let wired = wiring::wire(&cfg, &instance).await?;
    let probe_key = format!("{}.readyz", cfg.sweep.lock_key);
    start_checks(&cfg, &wired, &probe_key).await?;
    declare_topology(&cfg).await?;
    let cancel = CancellationToken::new();
    // The recorder first, so counters the tasks bump from their first round on
    // (retention) reach /metrics.
    let _ = http::prometheus();
    // The admin API shows the relay's last sweep report from the shared state.
    let admin_service = cfg
        .admin
        .service(
            wired.admin.clone(),
            wired.state.clone(),
            vec![cfg.sweep.state_key.clone()],
        )
        .with_throughput(wired.throughput.clone())
        .with_locks(wired.lock.clone(), vec![cfg.sweep.lock_key.clone()]);
    let admin_service = match queue_depths(&cfg) {
        Some(depths) => admin_service.with_queue_depths(depths),
        None => admin_service,
    };
    let pauses = wired.admin.pauses.clone();
    let exchanges = wired.admin.outbox.clone();
    // The dashboard at /ui calls the same service under the same tokens.
    // Its live streams end when the relay stops: a graceful shutdown waits for
    // open requests, and an open overview page would otherwise be one forever.
    let (stop_ui, ui_shutdown) = tokio::sync::watch::channel(false);
    {
        let cancel = cancel.clone();
        tokio::spawn(async move {
            cancel.cancelled().await;
            let _ = stop_ui.send(true);
        });
    }
    // Sessions in the outbox's schema: a restart (or a second instance) keeps
    // operators signed in. Expired ones are deleted every few minutes.
    let session_store: Option<std::sync::Arc<dyn tower_sessions_core::SessionStore>> = match (
        &wired.postgres,
        cfg.admin.ui.enabled,
    ) {
        (Some((pool, schema)), true) => {
            let store = outbox_adapters_postgres::ui_sessions(pool.clone(), schema)?;
            let (pool, schema, cancel) = (pool.clone(), schema.clone(), cancel.clone());
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        () = cancel.cancelled() => return,
                        () = tokio::time::sleep(std::time::Duration::from_secs(600)) => {}
                    }
                    if let Err(e) =
                        outbox_adapters_postgres::delete_expired_ui_sessions(&pool, &schema).await
                    {
                        tracing::debug!(error = %e, "expired dashboard sessions not deleted; trying again later");
                    }
                }
            });
            Some(std::sync::Arc::new(store))
        }
        _ => None,
    };
    let ui = cfg
        .admin
        .ui_router(admin_service.clone(), Some(ui_shutdown), session_store);
    let admin = cfg.admin.router(admin_service);
    if cfg.http.enabled
        && !cfg.admin.tokens.is_empty()
        && cfg.admin.ui.enabled
        && !cfg.admin.ui.secure_cookies
        && !cfg.http.address.ip().is_loopback()
    {
        tracing::warn!(
            address = %cfg.http.address,
            "the dashboard's session cookie is sent without Secure on a non-loopback address: serve /ui over HTTPS (a proxy) and set admin.ui.secure_cookies = true"
        );
    }
    if cfg.http.enabled && cfg.admin.tokens.is_empty() {
        tracing::info!(
            "admin API at {} is closed: configure [[admin.tokens]] to open it",
            crate::admin_api::ADMIN_API_PATH
        );
    }
    let mut builder = RelayBuilder::new(
        wired.store.clone(),
        wired.publisher.clone(),
        wired.lock.clone(),
        wired.state,
    )
    .dispatch(DispatcherConfig {
        retry: cfg.retry,
        ..cfg.dispatch.clone()
    })
    .sweep(cfg.sweep.clone())
    .retention(cfg.retention.clone())
    .throughput(wired.throughput.clone())
    .stall_after(cfg.health.stall_after)
    .instance(instance);
    if let Some(w) = wired.wakeup {
        builder = builder.wakeup(w);
    }
    let mut relay = builder.start(&cancel);
    let reports = std::mem::replace(&mut relay.reports, tokio::sync::mpsc::channel(1).1);
    let sweeps = tokio::spawn(http::record_sweeps(reports));
    let server = if let Some(listener) = listener {
        let state = http::HttpState {
            store: wired.store,
            publisher: wired.publisher,
            lock: wired.lock,
            lock_probe_key: probe_key,
            counters: relay.counters.clone(),
            token: cfg.http.token.clone(),
            health: relay.health.clone(),
            progress: Some(relay.progress.clone()),
            pauses: Some(pauses),
            exchanges: Some(exchanges),
        };
        let address = cfg.http.address;
        let c = cancel.clone();
        Some(tokio::spawn(async move {
            match http::serve_with_admin_and_ui(listener, state, admin, ui, c.clone()).await {
                Ok(()) => true,
                Err(e) => {
                    tracing::error!(%address, error = %e, "HTTP endpoints failed; stopping");
                    eprintln!("error: cannot serve HTTP on {address}: {e}");
                    c.cancel();
                    false
                }
            }
        }))
    } else {
        None
    };
    let health = relay.health.clone();
    tokio::select! {
        () = shutdown_signal() => {}
        () = cancel.cancelled() => {}
        // A task that panicked or stopped: exit non-zero so a supervisor restarts
        // the process, rather than stay up publishing nothing.
        () = health.failed() => {}
    }
    cancel.cancel();
    // Batches in flight finish: a batch publishes within its lease (the publish
    // budget ends before it) and is then marked, so a lease plus time for the mark
    // bounds it. Cutting it shorter would interrupt a batch in hand; unconfirmed
    // rows would stay claimable when their lease runs out (duplicates, not loss).
    let bound = cfg.dispatch.lease_ttl + Duration::from_secs(10);
    if tokio::time::timeout(bound, relay.join()).await.is_err() {
        tracing::warn!(?bound, "relay tasks did not stop in time; exiting anyway");
    }
    let http_ok = match server {
        Some(s) => s.await.unwrap_or(false),
        None => true,
    };
    sweeps.abort();
    tracing::info!("relay stopped");
    if let Some(why) = health.failure() {
        eprintln!("error: relay task failed: {why}");
        return Ok(ExitCode::FAILURE);
    }
    Ok(if http_ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// `outbox dead ...` on the outbox: lists read the operator's port; every write
/// goes through the admin service, so it is audited as `cli:<os user>` like the
/// `outbox messages` commands.
#[allow(clippy::print_stdout)]
async fn dead(
    store: &dyn OutboxStore,
    operator: &dyn outbox_ports::OutboxOperator,
    service: &outbox_admin::AdminService,
    action: DeadAction,
) -> anyhow::Result<ExitCode> {
    let parse = |id: &str| -> anyhow::Result<MessageId> {
        id.parse::<MessageId>().map_err(|e| anyhow::anyhow!("{e}"))
    };
    let refused = |id: MessageId, e: outbox_admin::AdminError| -> anyhow::Error {
        match e {
            outbox_admin::AdminError::Port(PortError::NotFound { .. }) => {
                anyhow::anyhow!("no message with id {id}")
            }
            outbox_admin::AdminError::Port(PortError::NotDeletable(refused)) => anyhow::anyhow!(
                "message {id} is {}, not dead; only dead messages are deleted",
                refused.status
            ),
            other => other.into(),
        }
    };
    let actor = admin_cli::cli_actor();
    match action {
        DeadAction::List { limit, .. } => {
            let dead = operator.oldest_messages(OutboxStatus::Dead, limit).await?;
            for r in &dead {
                println!(
                    "{}\t{}\t{}\t{}\tattempts={}\t{}",
                    r.message.id,
                    outbox_admin::params::format_time(r.message.created_at),
                    crate::admin_output::printable(&r.message.exchange),
                    crate::admin_output::printable(&r.message.routing_key),
                    r.publish.attempts,
                    crate::admin_output::printable(r.publish.last_error.as_deref().unwrap_or(""))
                );
            }
            eprintln!("{} dead message(s) shown", dead.len());
        }
        DeadAction::Requeue { id: Some(id), .. } => {
            let id = parse(&id)?;
            service
                .requeue_message(&actor, id)
                .await
                .map_err(|e| refused(id, e))?;
            eprintln!("requeued {id}");
        }
        DeadAction::Requeue { id: None, .. } => {
            // Every dead message, in bounded batches server-side (one audit entry).
            let filter = outbox_ports::MessageFilter {
                status: Some(OutboxStatus::Dead),
                ..outbox_ports::MessageFilter::default()
            };
            let total = store.stats().await?.dead;
            let bar = if std::io::stderr().is_terminal() {
                indicatif::ProgressBar::new(total)
            } else {
                indicatif::ProgressBar::hidden()
            };
            let outcome = service
                .requeue_matching_with_progress(
                    &actor,
                    &filter,
                    "status=dead (outbox dead requeue --all)".to_owned(),
                    false,
                    i64::MAX.unsigned_abs(),
                    &mut |p| bar.set_position(p.changed),
                )
                .await;
            bar.finish_and_clear();
            eprintln!("requeued {} dead message(s)", outcome?.changed);
        }
        DeadAction::Reconsume { consumer, .. } => {
            return Err(anyhow::anyhow!(
                "reconsume is consumer {consumer}'s; use the inbox"
            ));
        }
        DeadAction::Delete { id } => {
            let id = parse(&id)?;
            // The store refuses anything but a dead message in the delete itself, so
            // a requeue racing this command cannot lose a message.
            service
                .delete_message(&actor, id, false)
                .await
                .map_err(|e| refused(id, e))?;
            eprintln!("deleted {id}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Consume-side dead letters in the PostgreSQL inbox: list `consumer`'s dead
/// deliveries, or reconsume `id`.
#[allow(clippy::print_stdout)]
async fn consumer_dead(
    cfg: &RelayConfig,
    consumer: &str,
    reconsume: Option<String>,
    limit: u32,
) -> anyhow::Result<ExitCode> {
    use outbox_ports::InboxOperator as _;
    let Some((pool, schema)) = wiring::postgres(cfg).await? else {
        eprintln!(
            "error: invalid configuration `postgres.url`: consumer dead letters live in the PostgreSQL inbox"
        );
        return Ok(ExitCode::from(CONFIG_ERROR));
    };
    let inbox = outbox_adapters_postgres::PgInboxStore::new(pool, &schema);
    match reconsume {
        Some(id) => {
            let id: MessageId = id.parse().map_err(|e| anyhow::anyhow!("{e}"))?;
            // Through the admin service: audited as cli:<os user>.
            let service = admin_cli::service(cfg).await?;
            service
                .reconsume(&admin_cli::cli_actor(), consumer, id, false)
                .await
                .map_err(|e| match e {
                    outbox_admin::AdminError::Port(PortError::NotFound { .. }) => {
                        anyhow::anyhow!("consumer {consumer} has no delivery with id {id}")
                    }
                    other => other.into(),
                })?;
            eprintln!("reconsume {id} for {consumer}: queued for its consume sweep");
        }
        None => {
            let dead = inbox
                .oldest_deliveries(consumer, InboxStatus::Dead, limit)
                .await?;
            for r in &dead {
                println!(
                    "{}\t{}\t{}\tattempts={}\t{}",
                    r.message.id,
                    outbox_admin::params::format_time(r.message.created_at),
                    crate::admin_output::printable(&r.message.routing_key),
                    r.consume.attempts,
                    crate::admin_output::printable(r.consume.last_error.as_deref().unwrap_or(""))
                );
            }
            let service = admin_cli::service(cfg).await?;
            let letters = admin_cli::consumer_dead_letters(&service, consumer, limit).await?;
            eprintln!(
                "{} dead deliveries and {letters} dead letter(s) (undecodable deliveries, marked dead-letter; see `outbox dead-letters show ID`) of {consumer} shown",
                dead.len()
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    use super::Cli;

    #[test]
    fn an_error_printed_escapes_what_messages_put_in_it() {
        let e = anyhow::anyhow!("handler failed: \u{1b}[2J\u{9b}31m\r\nsecond line")
            .context("reconsume 0190aa");
        let text = super::error_text(&e);
        assert!(
            !text.chars().any(|c| c.is_control() && c != '\n'),
            "{text:?}"
        );
        assert!(
            text.starts_with("error: reconsume 0190aa: handler failed: \\u{1b}[2J"),
            "{text:?}"
        );
        assert!(text.ends_with("\\r\nsecond line"), "{text:?}");
    }

    /// Every subcommand, nested ones included, with its path.
    fn every_subcommand(cmd: &clap::Command, path: &str, out: &mut Vec<(String, clap::Command)>) {
        for sub in cmd.get_subcommands() {
            let here = format!("{path} {}", sub.get_name());
            out.push((here.clone(), sub.clone()));
            every_subcommand(sub, &here, out);
        }
    }

    #[test]
    fn every_subcommands_help_has_examples_of_itself() {
        let mut all = Vec::new();
        every_subcommand(&Cli::command(), "outbox", &mut all);
        assert!(all.len() > 30, "{} subcommands", all.len());
        for (path, mut cmd) in all {
            if path.ends_with(" help") {
                continue; // clap's own
            }
            let help = cmd.render_long_help().to_string();
            let examples = help
                .split_once("Examples:")
                .unwrap_or_else(|| panic!("`{path} --help` has no Examples: section:\n{help}"))
                .1;
            assert!(
                examples.lines().any(|l| l.trim_start().starts_with(&path)),
                "`{path} --help`: no example runs `{path}`:\n{examples}"
            );
        }
    }
}
