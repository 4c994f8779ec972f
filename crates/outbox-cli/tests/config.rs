//! Relay configuration: file + `OUTBOX__` overrides, validation naming the setting,
//! secrets redacted.
#![cfg(feature = "cli")]

use std::io::Write as _;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use outbox_cli::config::{CoordinationKind, RelayConfig, StoreKind};

const GOOD: &str = r#"
[adapters]
store = "postgres"
publisher = "rabbitmq"
lock = "redis"
sweep_state = "postgres"

[postgres]
url = "postgres://app:pg-secret@127.0.0.1:5432/shop"

[rabbitmq]
url = "amqp://guest:mq-secret@127.0.0.1:5672/%2f"

[redis]
url = "redis://:redis-secret@127.0.0.1:6379/"

[sweep]
interval = "5s"
"#;

fn file(text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("outbox-config-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join(format!("{}.toml", outbox_testkit::unique_key("cfg")));
    std::fs::File::create(&path)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .expect("write config");
    path
}

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

#[test]
fn a_good_file_loads_with_defaults_and_env_overrides() {
    let cfg = RelayConfig::load_with_env(
        &file(GOOD),
        env(&[
            ("OUTBOX__POSTGRES__SCHEMA", "orders_outbox"),
            ("OUTBOX__DISPATCH__BATCH_SIZE", "250"),
            ("OUTBOX_TEST_DATABASE_URL", "postgres://not-for-the-loader"),
        ]),
    )
    .expect("loads");
    assert_eq!(cfg.adapters.store, StoreKind::Postgres);
    assert_eq!(cfg.adapters.lock, CoordinationKind::Redis);
    let pg = cfg.postgres.as_ref().expect("postgres");
    assert_eq!(pg.schema, "orders_outbox");
    assert_eq!(
        pg.url, "postgres://app:pg-secret@127.0.0.1:5432/shop",
        "single-underscore variables never reach the loader"
    );
    assert_eq!(cfg.dispatch.batch_size, 250);
    assert_eq!(cfg.sweep.interval, std::time::Duration::from_secs(5));
    assert_eq!(cfg.sweep.batch_size, 50, "seed default");
    assert_eq!(
        cfg.sweep.lock_key, "outbox.orders_outbox.retry.run-lock",
        "default keys are scoped by schema"
    );
    assert_eq!(cfg.sweep.state_key, "outbox.orders_outbox.retry.last-state");
    let explicit =
        RelayConfig::load_with_env(&file(GOOD), env(&[("OUTBOX__SWEEP__LOCK_KEY", "my.lock")]))
            .expect("loads");
    assert_eq!(explicit.sweep.lock_key, "my.lock", "explicit keys are kept");
    let shown = format!("{cfg:?}");
    for secret in ["pg-secret", "mq-secret", "redis-secret"] {
        assert!(!shown.contains(secret), "{secret} in {shown}");
    }
}

/// One dispatcher configuration: `[dispatch]` is the embedders' `DispatcherConfig`,
/// with the binary's defaults on both sides; what is not a setting of the file
/// (`error_backoff`, `retry`) is refused there.
#[test]
fn dispatch_is_the_embedders_dispatcher_config_with_the_binarys_defaults() {
    let cfg = RelayConfig::load_with_env(&file(GOOD), env(&[])).expect("loads");
    let embedded = outbox_relay::DispatcherConfig::default();
    for (name, file_side, embedder_side) in [
        (
            "batch_size",
            u64::from(cfg.dispatch.batch_size),
            u64::from(embedded.batch_size),
        ),
        (
            "pipelines",
            cfg.dispatch.pipelines as u64,
            embedded.pipelines as u64,
        ),
    ] {
        assert_eq!(file_side, embedder_side, "{name}");
    }
    assert_eq!(cfg.dispatch.batch_size, 500);
    assert_eq!(cfg.dispatch.lease_ttl, Duration::from_secs(60));
    assert_eq!(cfg.dispatch.idle_poll, Duration::from_secs(1));
    assert_eq!(embedded.lease_ttl, cfg.dispatch.lease_ttl);
    assert_eq!(embedded.idle_poll, cfg.dispatch.idle_poll);
    let loaded = RelayConfig::load_with_env(
        &file(&format!(
            "{GOOD}\n[dispatch]\nlease_ttl = \"90s\"\nidle_poll = \"250ms\"\npipelines = 2\n"
        )),
        env(&[]),
    )
    .expect("loads");
    assert_eq!(loaded.dispatch.lease_ttl, Duration::from_secs(90));
    assert_eq!(loaded.dispatch.idle_poll, Duration::from_millis(250));
    assert_eq!(loaded.dispatch.pipelines, 2);
    for key in ["error_backoff = \"1s\"", "retry = 3"] {
        let err = error_of(&format!("{GOOD}\n[dispatch]\n{key}\n"), &[]);
        assert!(
            err.contains(key.split(' ').next().unwrap_or_default()),
            "{key}: {err}"
        );
    }
}

fn error_of(text: &str, vars: &[(&str, &str)]) -> String {
    RelayConfig::load_with_env(&file(text), env(vars))
        .expect_err("invalid")
        .to_string()
}

#[test]
fn every_kind_of_bad_config_names_its_setting() {
    type Case<'a> = (String, Vec<(&'a str, &'a str)>, &'a str);
    let cases: Vec<Case<'_>> = vec![
        (
            GOOD.replace("store = \"postgres\"", "store = \"mysql\""),
            vec![],
            "mysql",
        ),
        (
            format!("{GOOD}\n[dispatch]\nbatch_sise = 3\n"),
            vec![],
            "batch_sise",
        ),
        (
            GOOD.to_owned(),
            vec![("OUTBOX__DISPATCH__BATCH_SIZE", "0")],
            "dispatch.batch_size",
        ),
        (
            GOOD.to_owned(),
            vec![("OUTBOX__POSTGRES__URL", "mysql://x")],
            "postgres.url",
        ),
        (
            GOOD.to_owned(),
            vec![("OUTBOX__RABBITMQ__URL", "http://nope")],
            "rabbitmq.url",
        ),
        (
            GOOD.to_owned(),
            vec![("OUTBOX__REDIS__URL", "nope")],
            "redis.url",
        ),
        (
            GOOD.to_owned(),
            vec![("OUTBOX__POSTGRES__SCHEMA", "x; drop")],
            "postgres.schema",
        ),
        (
            GOOD.to_owned(),
            vec![("OUTBOX__SWEEP__INTERVAL", "soon")],
            "soon",
        ),
        (
            GOOD.to_owned(),
            vec![("OUTBOX__HTTP__ADDRESS", "0.0.0.0:9090")],
            "http.token",
        ),
        (
            GOOD.replace(
                "[redis]\nurl = \"redis://:redis-secret@127.0.0.1:6379/\"",
                "",
            ),
            vec![],
            "redis.url",
        ),
        (
            GOOD.to_owned(),
            vec![
                ("OUTBOX__DISPATCH__LEASE_TTL", "10s"),
                ("OUTBOX__RABBITMQ__CONFIRM_TIMEOUT", "10s"),
            ],
            "dispatch.lease_ttl",
        ),
        (
            GOOD.to_owned(),
            vec![("OUTBOX__DISPATCH__PIPELINES", "0")],
            "dispatch.pipelines",
        ),
    ];
    for (text, vars, needle) in cases {
        let e = error_of(&text, &vars);
        assert!(e.contains(needle), "expected {needle:?} in: {e}");
        assert!(!e.contains("secret"), "a secret leaked: {e}");
    }
}

#[test]
fn the_binary_refuses_bad_config_with_exit_code_2() {
    let path = file(&GOOD.replace("publisher = \"rabbitmq\"", "publisher = \"kafka\""));
    let out = Command::new(env!("CARGO_BIN_EXE_outbox"))
        .args(["run", "--config"])
        .arg(&path)
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("kafka"), "{err}");
    let out = Command::new(env!("CARGO_BIN_EXE_outbox"))
        .args(["migrate", "--config", "/nonexistent/outbox.toml"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/outbox.toml"));
}

#[test]
fn a_taken_http_address_stops_the_relay_with_an_error() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let address = taken.local_addr().expect("addr");
    let path = file(&format!(
        "[adapters]\nstore = \"memory\"\npublisher = \"memory\"\nlock = \"memory\"\nsweep_state = \"memory\"\n[http]\naddress = \"{address}\"\n"
    ));
    let out = Command::new(env!("CARGO_BIN_EXE_outbox"))
        .args(["run", "--config"])
        .arg(&path)
        .output()
        .expect("run");
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("cannot serve HTTP on {address}")),
        "{err}"
    );
    // Before anything else started: no dispatcher ran.
    assert!(!err.contains("dispatcher started"), "{err}");
}

#[test]
fn retention_is_on_by_default_and_set_from_file_or_environment() {
    use std::time::Duration;
    let cfg = RelayConfig::load_with_env(&file(GOOD), env(&[])).expect("loads");
    let r = &cfg.retention;
    assert!(r.enabled, "retention runs unless turned off");
    assert_eq!(r.sent_after, Duration::from_secs(7 * 24 * 3600));
    assert_eq!(r.interval, Duration::from_secs(60));
    assert_eq!(r.batch_size, 5000);
    assert_eq!(r.vacuum, outbox_relay::VacuumMode::Auto);

    let from_file = RelayConfig::load_with_env(
        &file(&format!(
            "{GOOD}\n[retention]\nenabled = false\nsent_after = \"2h\"\ninterval = \"10s\"\nbatch_size = 100\n"
        )),
        env(&[]),
    )
    .expect("loads");
    let r = &from_file.retention;
    assert_eq!(
        (r.enabled, r.sent_after, r.interval, r.batch_size),
        (
            false,
            Duration::from_secs(7200),
            Duration::from_secs(10),
            100
        )
    );

    let from_env = RelayConfig::load_with_env(
        &file(GOOD),
        env(&[
            ("OUTBOX__RETENTION__SENT_AFTER", "1s"),
            ("OUTBOX__RETENTION__INTERVAL", "250ms"),
            ("OUTBOX__RETENTION__BATCH_SIZE", "7"),
            ("OUTBOX__RETENTION__ENABLED", "false"),
            ("OUTBOX__RETENTION__VACUUM", "never"),
        ]),
    )
    .expect("any positive duration is accepted");
    let r = &from_env.retention;
    assert_eq!(r.vacuum, outbox_relay::VacuumMode::Never);
    assert_eq!(
        (r.enabled, r.sent_after, r.interval, r.batch_size),
        (false, Duration::from_secs(1), Duration::from_millis(250), 7)
    );
}

#[test]
fn zero_retention_settings_are_refused_by_name() {
    for (var, value, needle) in [
        (
            "OUTBOX__RETENTION__SENT_AFTER",
            "0s",
            "retention.sent_after",
        ),
        ("OUTBOX__RETENTION__INTERVAL", "0ms", "retention.interval"),
        ("OUTBOX__RETENTION__BATCH_SIZE", "0", "retention.batch_size"),
        ("OUTBOX__RETENTION__SENT_AFTER", "soon", "soon"),
        ("OUTBOX__RETENTION__VACUUM", "always", "always"),
    ] {
        let e = error_of(GOOD, &[(var, value)]);
        assert!(e.contains(needle), "expected {needle:?} in: {e}");
    }
    let e = error_of(&format!("{GOOD}\n[retention]\nsent_afterr = \"1d\"\n"), &[]);
    assert!(e.contains("sent_afterr"), "unknown fields are refused: {e}");
}

const ADMIN: &str = r#"
[admin]
redact_headers = ["authorization"]
redact_json_fields = ["card_number"]

[[admin.tokens]]
name = "dashboard"
secret = "read-secret-0123456789"
role = "read"

[[admin.tokens]]
name = "ops"
secret = "write-secret-0123456789"
role = "write"
"#;

#[test]
fn admin_tokens_load_from_the_file_and_debug_hides_their_secrets() {
    use outbox_cli::admin_api::Role;
    let cfg = RelayConfig::load_with_env(
        &file(&format!("{GOOD}{ADMIN}")),
        env(&[("OUTBOX__ADMIN__REDACT_HEADERS", "authorization,x-api-key")]),
    )
    .expect("loads");
    let tokens: Vec<_> = cfg
        .admin
        .tokens
        .iter()
        .map(|t| (t.name.as_str(), t.role))
        .collect();
    assert_eq!(tokens, [("dashboard", Role::Read), ("ops", Role::Write)]);
    assert_eq!(
        cfg.admin.redact_headers,
        ["authorization", "x-api-key"],
        "a list from the environment replaces the file's"
    );
    assert_eq!(cfg.admin.redact_json_fields, ["card_number"]);
    let shown = format!("{cfg:?}");
    for secret in ["read-secret-0123456789", "write-secret-0123456789"] {
        assert!(!shown.contains(secret), "{shown}");
    }
    assert!(shown.contains("dashboard") && shown.contains("***"));
    let closed = RelayConfig::load_with_env(&file(GOOD), env(&[])).expect("loads");
    assert!(
        closed.admin.tokens.is_empty(),
        "no tokens unless configured"
    );
}

#[test]
fn bad_admin_tokens_are_refused_by_name() {
    let token = |name: &str, secret: &str, role: &str| {
        format!("[[admin.tokens]]\nname = \"{name}\"\nsecret = \"{secret}\"\nrole = \"{role}\"\n")
    };
    let cases = [
        (
            token("", "0123456789abcdef", "read"),
            "admin.tokens[0].name",
        ),
        (
            token("a", "0123456789abcdef", "read") + &token("a", "0123456789abcdeX", "write"),
            "admin.tokens[1].name",
        ),
        (token("a", "too-short", "read"), "admin.tokens[0].secret"),
        (
            token("a", "0123456789abcdef", "superuser"),
            "admin.tokens[0]role",
        ),
        (
            "[[admin.tokens]]\nname = \"a\"\nrole = \"read\"\n".to_owned(),
            "secret",
        ),
        ("[admin]\nusers = []\n".to_owned(), "users"),
    ];
    for (text, named) in cases {
        let e = error_of(&format!("{GOOD}{text}"), &[]);
        assert!(e.contains(named), "{text}: {e}");
        assert!(!e.contains("too-short"), "the secret is not shown: {e}");
    }
}

#[test]
fn the_example_config_loads_with_the_admin_api_closed() {
    let example =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../outbox.example.toml");
    let cfg = RelayConfig::load_with_env(&example, env(&[])).expect("outbox.example.toml loads");
    assert!(cfg.admin.tokens.is_empty());
    assert_eq!(cfg.admin.redact_headers, ["authorization"]);
}

#[test]
fn the_example_topology_loads_when_uncommented_and_needs_the_rabbitmq_publisher() {
    let example =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../outbox.example.toml");
    let text = std::fs::read_to_string(example).expect("example");
    let start = text
        .find("# [[topology.exchanges]]")
        .expect("a topology example");
    let block: String = text[start..]
        .lines()
        .map(|l| l.strip_prefix("# ").unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n");
    let cfg = RelayConfig::load_with_env(&file(&format!("{GOOD}\n{block}\n")), env(&[]))
        .expect("the example topology loads");
    let t = cfg.topology.to_topology().expect("valid");
    assert_eq!(
        (t.exchanges.len(), t.queues.len(), t.bindings.len()),
        (1, 1, 1)
    );
    let memory = GOOD.replace("publisher = \"rabbitmq\"", "publisher = \"memory\"");
    let err = RelayConfig::load_with_env(&file(&format!("{memory}\n{block}\n")), env(&[]))
        .expect_err("topology without RabbitMQ");
    assert!(err.to_string().contains("topology"), "{err}");
}

#[test]
fn log_and_telemetry_default_to_text_and_no_exporter_and_load_from_file_or_environment() {
    use outbox_cli::config::LogFormat;
    let cfg = RelayConfig::load_with_env(&file(GOOD), env(&[])).expect("loads");
    assert_eq!(cfg.log.format, LogFormat::Text);
    assert_eq!(cfg.log.filter, None);
    assert_eq!(cfg.telemetry.otlp_endpoint, None);
    assert_eq!(cfg.telemetry.service_name, "outbox");
    assert!((cfg.telemetry.sampling_ratio - 1.0).abs() < f64::EPSILON);
    let cfg = RelayConfig::load_with_env(
        &file(&format!(
            "{GOOD}\n[log]\nformat = \"json\"\nfilter = \"warn,outbox_relay=debug\"\n\n[telemetry]\nservice_name = \"relay-eu\"\nsampling_ratio = 0.25\n"
        )),
        env(&[("OUTBOX__TELEMETRY__SAMPLING_RATIO", "0.5")]),
    )
    .expect("loads");
    assert_eq!(cfg.log.format, LogFormat::Json);
    assert_eq!(cfg.log.filter.as_deref(), Some("warn,outbox_relay=debug"));
    assert_eq!(cfg.telemetry.service_name, "relay-eu");
    assert!((cfg.telemetry.sampling_ratio - 0.5).abs() < f64::EPSILON);
    if cfg!(feature = "otel") {
        let cfg = RelayConfig::load_with_env(
            &file(&format!(
                "{GOOD}\n[telemetry]\notlp_endpoint = \"http://127.0.0.1:4318\"\n"
            )),
            env(&[]),
        )
        .expect("loads");
        assert_eq!(
            cfg.telemetry.otlp_endpoint.as_deref(),
            Some("http://127.0.0.1:4318")
        );
    }
}

#[test]
fn bad_log_and_telemetry_settings_are_refused_by_name() {
    let cases = [
        ("[log]\nformat = \"yaml\"\n", "yaml"),
        ("[log]\nfromat = \"json\"\n", "fromat"),
        ("[log]\nfilter = \"info,=[\"\n", "log.filter"),
        (
            "[telemetry]\nsampling_ratio = 1.5\n",
            "telemetry.sampling_ratio",
        ),
        (
            "[telemetry]\nsampling_ratio = -0.1\n",
            "telemetry.sampling_ratio",
        ),
        (
            "[telemetry]\nservice_name = \" \"\n",
            "telemetry.service_name",
        ),
        (
            "[telemetry]\notlp_endpiont = \"http://x\"\n",
            "otlp_endpiont",
        ),
        (
            "[telemetry]\notlp_endpoint = \"https://collector:4318\"\n",
            "telemetry.otlp_endpoint",
        ),
        (
            "[telemetry]\notlp_endpoint = \"grpc://collector:4317\"\n",
            "telemetry.otlp_endpoint",
        ),
        (
            "[telemetry]\notlp_endpoint = \"http://\"\n",
            "telemetry.otlp_endpoint",
        ),
    ];
    for (section, needle) in cases {
        let e = error_of(&format!("{GOOD}\n{section}"), &[]);
        assert!(e.contains(needle), "expected {needle:?} in: {e}");
    }
}

#[test]
fn tls_config_files_are_checked_at_load_naming_the_setting() {
    let pki = match outbox_testkit::tls::TestPki::generate("config") {
        Ok(pki) => pki,
        Err(e) if outbox_testkit::tls::in_ci() => panic!("{e}"),
        Err(e) => {
            eprintln!("SKIPPED (not in CI): {e}");
            return;
        }
    };
    let p = |path: &std::path::Path| format!("'{}'", path.display());
    let amqps = "url = \"amqps://guest:mq-secret@127.0.0.1:5671/%2f\"";
    let rabbit = |url: &str, extra: &str| {
        GOOD.replace(
            "url = \"amqp://guest:mq-secret@127.0.0.1:5672/%2f\"",
            &format!("{url}\n{extra}"),
        )
    };
    let redis = |url: &str, extra: &str| {
        GOOD.replace(
            "url = \"redis://:redis-secret@127.0.0.1:6379/\"",
            &format!("{url}\n{extra}"),
        )
    };
    let cases = [
        (
            rabbit(amqps, "tls_ca_file = '/nonexistent/ca.pem'"),
            "rabbitmq.tls_ca_file",
            "/nonexistent/ca.pem",
        ),
        (
            rabbit(amqps, &format!("tls_ca_file = {}", p(&pki.client_key))),
            "rabbitmq.tls_ca_file",
            "no PEM certificate",
        ),
        (
            rabbit(
                "url = \"amqp://guest:mq-secret@127.0.0.1:5672/%2f\"",
                &format!("tls_ca_file = {}", p(&pki.ca)),
            ),
            "rabbitmq.tls_ca_file",
            "not amqps://",
        ),
        (
            rabbit(
                amqps,
                &format!("tls_client_cert_file = {}", p(&pki.client_cert)),
            ),
            "rabbitmq.tls_client_key_file",
            "is required",
        ),
        (
            rabbit(
                amqps,
                &format!(
                    "tls_client_cert_file = {}\ntls_client_key_file = {}",
                    p(&pki.client_cert),
                    p(&pki.client_cert)
                ),
            ),
            "rabbitmq.tls_client_key_file",
            "no PEM private key",
        ),
        (
            redis(
                "url = \"rediss://:redis-secret@127.0.0.1:6390/\"",
                &format!("tls_ca_file = {}", p(&pki.server_key)),
            ),
            "redis.tls_ca_file",
            "no PEM certificate",
        ),
        (
            redis(
                "url = \"redis://:redis-secret@127.0.0.1:6379/\"",
                &format!("tls_ca_file = {}", p(&pki.ca)),
            ),
            "redis.tls_ca_file",
            "not rediss://",
        ),
    ];
    for (text, field, reason) in cases {
        let e = error_of(&text, &[]);
        assert!(e.contains(field) && e.contains(reason), "{field}: {e}");
    }
    let good = redis(
        "url = \"rediss://:redis-secret@127.0.0.1:6390/\"",
        &format!("tls_ca_file = {}", p(&pki.ca)),
    );
    let good = good.replace(
        "url = \"amqp://guest:mq-secret@127.0.0.1:5672/%2f\"",
        &format!(
            "{amqps}\ntls_ca_file = {}\ntls_client_cert_file = {}\ntls_client_key_file = {}",
            p(&pki.ca),
            p(&pki.client_cert),
            p(&pki.client_key)
        ),
    );
    let cfg = RelayConfig::load_with_env(&file(&good), env(&[])).expect("TLS settings load");
    let rabbit = cfg.rabbitmq.as_ref().expect("rabbitmq");
    assert!(rabbit.tls().expect("files").is_set());
    let shown = format!("{cfg:?}");
    let key = std::fs::read_to_string(&pki.client_key).expect("key");
    let key_body = key.lines().nth(1).expect("a key line");
    assert!(!shown.contains(key_body), "the key is shown: {shown}");
    assert!(shown.contains("tls_ca_file"), "{shown}");
}

#[test]
fn postgres_bounds_and_the_stall_watchdog_default_and_load_from_file_or_environment() {
    let cfg = RelayConfig::load_with_env(&file(GOOD), env(&[])).expect("loads");
    let pg = cfg.postgres.as_ref().expect("postgres section");
    assert_eq!(
        (
            pg.statement_timeout,
            pg.lock_timeout,
            pg.keepalive_idle,
            pg.keepalive_interval,
            pg.keepalive_count,
            cfg.health.stall_after,
        ),
        (
            Duration::from_secs(30),
            Duration::from_secs(10),
            Duration::from_secs(60),
            Duration::from_secs(10),
            6,
            Duration::from_secs(60),
        )
    );
    let bounds = pg.session_bounds();
    assert_eq!(bounds.statement_timeout, Some(Duration::from_secs(30)));
    assert_eq!(bounds.keepalive_count, Some(6));
    let cfg = RelayConfig::load_with_env(
        &file(
            &format!("{GOOD}\n[health]\nstall_after = \"90s\"\n").replace(
                "[postgres]\n",
                "[postgres]\nstatement_timeout = \"20s\"\nkeepalive_count = 3\n",
            ),
        ),
        env(&[
            ("OUTBOX__POSTGRES__LOCK_TIMEOUT", "2s"),
            ("OUTBOX__POSTGRES__KEEPALIVE_IDLE", "15s"),
            ("OUTBOX__POSTGRES__KEEPALIVE_INTERVAL", "5s"),
            ("OUTBOX__HEALTH__STALL_AFTER", "250ms"),
        ]),
    )
    .expect("loads");
    let pg = cfg.postgres.as_ref().expect("postgres section");
    assert_eq!(
        (
            pg.statement_timeout,
            pg.lock_timeout,
            pg.keepalive_idle,
            pg.keepalive_interval,
            pg.keepalive_count,
            cfg.health.stall_after,
        ),
        (
            Duration::from_secs(20),
            Duration::from_secs(2),
            Duration::from_secs(15),
            Duration::from_secs(5),
            3,
            Duration::from_millis(250),
        )
    );
}

#[test]
fn zero_or_unusable_bounds_are_refused_by_name() {
    for (var, value, needle) in [
        (
            "OUTBOX__POSTGRES__STATEMENT_TIMEOUT",
            "0s",
            "postgres.statement_timeout",
        ),
        (
            "OUTBOX__POSTGRES__LOCK_TIMEOUT",
            "0ms",
            "postgres.lock_timeout",
        ),
        // A lock wait longer than the statement's own bound could never happen.
        (
            "OUTBOX__POSTGRES__LOCK_TIMEOUT",
            "31s",
            "postgres.lock_timeout",
        ),
        // PostgreSQL holds these in a 32-bit count of milliseconds.
        (
            "OUTBOX__POSTGRES__STATEMENT_TIMEOUT",
            "25d",
            "postgres.statement_timeout",
        ),
        (
            "OUTBOX__POSTGRES__KEEPALIVE_IDLE",
            "0s",
            "postgres.keepalive_idle",
        ),
        // Keepalives count whole seconds.
        (
            "OUTBOX__POSTGRES__KEEPALIVE_INTERVAL",
            "500ms",
            "postgres.keepalive_interval",
        ),
        (
            "OUTBOX__POSTGRES__KEEPALIVE_COUNT",
            "0",
            "postgres.keepalive_count",
        ),
        ("OUTBOX__POSTGRES__KEEPALIVE_COUNT", "-1", "keepalive_count"),
        ("OUTBOX__HEALTH__STALL_AFTER", "0s", "health.stall_after"),
        ("OUTBOX__HEALTH__STALL_AFTER", "-5s", "-5s"),
        ("OUTBOX__HEALTH__STALL_AFTER", "soon", "soon"),
    ] {
        let e = error_of(GOOD, &[(var, value)]);
        assert!(
            e.contains(needle),
            "{var}={value}: expected {needle:?} in: {e}"
        );
    }
    let e = error_of(&format!("{GOOD}\n[health]\nstall_afterr = \"1m\"\n"), &[]);
    assert!(
        e.contains("stall_afterr"),
        "unknown fields are refused: {e}"
    );
}

#[test]
fn several_broker_nodes_load_from_file_or_environment_and_are_checked_by_name() {
    let nodes = GOOD.replace(
        "url = \"amqp://guest:mq-secret@127.0.0.1:5672/%2f\"",
        "urls = [\"amqp://guest:mq-secret@127.0.0.1:5681/%2f\", \"amqp://guest:mq-secret@127.0.0.1:5682/%2f\"]",
    );
    let cfg = RelayConfig::load_with_env(&file(&nodes), env(&[])).expect("urls alone load");
    let r = cfg.rabbitmq.as_ref().expect("rabbitmq");
    assert_eq!(r.nodes().len(), 2);
    let shown = format!("{r:?}");
    assert!(
        shown.contains("5682") && !shown.contains("mq-secret"),
        "{shown}"
    );

    // `url` keeps working, and comes first; the environment's list is comma-separated.
    let cfg = RelayConfig::load_with_env(
        &file(GOOD),
        env(&[(
            "OUTBOX__RABBITMQ__URLS",
            "amqp://guest:guest@127.0.0.1:5681/%2f,amqp://guest:guest@127.0.0.1:5683/%2f",
        )]),
    )
    .expect("url and urls load");
    let all = cfg.rabbitmq.as_ref().expect("rabbitmq").nodes();
    assert_eq!(all.len(), 3, "{all:?}");
    assert!(all[0].contains(":5672/"), "{all:?}");
    assert!(all[2].contains(":5683/"), "{all:?}");

    let bad = error_of(
        GOOD,
        &[(
            "OUTBOX__RABBITMQ__URLS",
            "amqp://guest:guest@127.0.0.1:5681/%2f,http://nope",
        )],
    );
    assert!(
        bad.contains("rabbitmq.urls") && bad.contains("node 3"),
        "{bad}"
    );
    // A comma in a password splits the list: no piece of it is shown.
    let split = error_of(
        GOOD,
        &[(
            "OUTBOX__RABBITMQ__URLS",
            "amqp://guest:pa,ss-word@127.0.0.1:5681/%2f",
        )],
    );
    assert!(
        split.contains("rabbitmq.urls") && !split.contains("ss-word"),
        "{split}"
    );
    // Another vhost (or user, or scheme) is another broker, not a node of this one.
    let other = error_of(
        GOOD,
        &[(
            "OUTBOX__RABBITMQ__URLS",
            "amqp://guest:guest@127.0.0.1:5681/other",
        )],
    );
    assert!(
        other.contains("rabbitmq.urls") && other.contains("same scheme, user and vhost"),
        "{other}"
    );
    assert!(!other.contains("mq-secret"), "{other}");
    // Empty entries (a trailing comma) are no nodes.
    let cfg = RelayConfig::load_with_env(
        &file(GOOD),
        env(&[(
            "OUTBOX__RABBITMQ__URLS",
            "amqp://guest:guest@127.0.0.1:5681/%2f,",
        )]),
    )
    .expect("a trailing comma loads");
    assert_eq!(cfg.rabbitmq.as_ref().expect("rabbitmq").nodes().len(), 2);
    let none = GOOD.replace("url = \"amqp://guest:mq-secret@127.0.0.1:5672/%2f\"", "");
    let missing = error_of(&none, &[]);
    assert!(missing.contains("rabbitmq.url"), "{missing}");
}

#[test]
fn a_bad_environment_variable_is_named_not_the_file() {
    let e = error_of(GOOD, &[("OUTBOX__SWEEP__INTERVALL", "5s")]);
    assert!(
        e.starts_with(
            "invalid configuration `OUTBOX__SWEEP__INTERVALL`: unknown field `intervall`"
        ),
        "{e}"
    );
    assert!(e.contains("(set in the environment)"), "{e}");
    let e = error_of(GOOD, &[("OUTBOX__SWEEP__INTERVAL", "5x")]);
    assert!(
        e.starts_with("invalid configuration `OUTBOX__SWEEP__INTERVAL`:"),
        "{e}"
    );
    assert!(e.contains("unknown unit"), "{e}");
    let e = error_of(GOOD, &[("OUTBOX__SWEEEP__INTERVAL", "5s")]);
    assert!(
        e.starts_with("invalid configuration `OUTBOX__SWEEEP__INTERVAL`:"),
        "{e}"
    );
    // The same mistake in the file is the file's.
    let e = error_of(
        &format!("bogus_setting = 1\n{GOOD}"),
        &[("OUTBOX__SWEEP__INTERVAL", "5s")],
    );
    assert!(!e.contains("OUTBOX__"), "{e}");
    assert!(e.contains("bogus_setting"), "{e}");
}

/// A token's secret can live in a file of its own (a mounted secret): read at
/// load, its final line break dropped; exactly one of `secret` and `secret_file`;
/// an unreadable file is refused naming the file, never showing a secret.
#[test]
fn a_token_secret_can_come_from_a_file() {
    let dir = std::env::temp_dir().join(format!("outbox-secret-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("admin-token");
    std::fs::write(&path, "file-secret-0123456789\n").expect("secret file");
    let entry = |body: &str| format!("[[admin.tokens]]\nname = \"ops\"\nrole = \"write\"\n{body}");
    let cfg = RelayConfig::load_with_env(
        &file(&format!(
            "{GOOD}{}",
            entry(&format!("secret_file = {:?}\n", path.display().to_string()))
        )),
        env(&[]),
    )
    .expect("loads");
    assert_eq!(cfg.admin.tokens.len(), 1);
    assert_eq!(
        cfg.admin.tokens[0].secret.expose(),
        "file-secret-0123456789"
    );
    assert!(!format!("{cfg:?}").contains("file-secret"));

    let e = error_of(
        &format!(
            "{GOOD}{}",
            entry("secret_file = \"/nonexistent/outbox-token\"\n")
        ),
        &[],
    );
    assert!(
        e.contains("/nonexistent/outbox-token") && e.contains("ops"),
        "{e}"
    );
    let e = error_of(
        &format!(
            "{GOOD}{}",
            entry(&format!(
                "secret = \"inline-secret-0123456789\"\nsecret_file = {:?}\n",
                path.display().to_string()
            ))
        ),
        &[],
    );
    assert!(e.contains("both secret and secret_file"), "{e}");
    assert!(
        !e.contains("inline-secret") && !e.contains("file-secret"),
        "{e}"
    );
    // Still checked as an inline one: a short secret in a file is refused too.
    std::fs::write(&path, "short\n").expect("secret file");
    let e = error_of(
        &format!(
            "{GOOD}{}",
            entry(&format!("secret_file = {:?}\n", path.display().to_string()))
        ),
        &[],
    );
    assert!(e.contains("tokens[0].secret") && e.contains("16"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `[admin.trusted_proxy]` loads into the dashboard's proxy sign-in, and each bad
/// setting is refused naming it: no address, an address that is not one, a header
/// that is not a header name, no role given to anyone.
#[test]
fn a_trusted_proxy_is_checked_when_the_configuration_loads() {
    let good = r#"
[admin.trusted_proxy]
header = "X-Forwarded-User"
groups_header = "X-Forwarded-Groups"
from = ["127.0.0.1/32", "10.0.0.7"]
users = { alice = "write" }
groups = { viewers = "read" }
secret = "proxy-secret-0123456789"
"#;
    let cfg = RelayConfig::load_with_env(&file(&format!("{GOOD}{good}")), env(&[])).expect("loads");
    let proxy = cfg
        .admin
        .trusted_proxy
        .as_ref()
        .expect("set")
        .proxy("admin")
        .expect("valid");
    assert_eq!(proxy.from.len(), 2);
    assert_eq!(proxy.user_header, "x-forwarded-user");
    assert_eq!(proxy.secret_header, "x-outbox-proxy-secret");
    assert_eq!(proxy.secret.expose(), "proxy-secret-0123456789");
    assert!(
        !format!("{cfg:?}").contains("proxy-secret-0123456789"),
        "Debug hides the proxy's secret"
    );
    for (bad, named) in [
        (
            good.replace(r#"["127.0.0.1/32", "10.0.0.7"]"#, "[]"),
            "from",
        ),
        (good.replace("10.0.0.7", "ten.zero"), "ten.zero"),
        (good.replace("10.0.0.7", "0.0.0.0/0"), "every address"),
        (
            good.replace(r#""X-Forwarded-User""#, r#""X Forwarded""#),
            "header",
        ),
        (
            good.replace(r#"users = { alice = "write" }"#, "")
                .replace(r#"groups = { viewers = "read" }"#, ""),
            "users",
        ),
        // Without the shared secret any local process could sign in (issue 47).
        (
            good.replace(r#"secret = "proxy-secret-0123456789""#, ""),
            "secret",
        ),
        (
            good.replace("proxy-secret-0123456789", "short"),
            "at least 16",
        ),
        (
            good.replace(
                r#"secret = "proxy-secret-0123456789""#,
                r#"secret_file = "/nonexistent/secret""#,
            ),
            "/nonexistent/secret cannot be read",
        ),
    ] {
        let e = error_of(&format!("{GOOD}{bad}"), &[]);
        assert!(
            e.contains("trusted_proxy") && e.contains(named),
            "{named}: {e}"
        );
        assert!(!e.contains("proxy-secret-0123456789"), "{e}");
    }
    // A forwarder is believed for X-Forwarded-For only; `/0` is refused.
    let forwarders = "[admin.ui]\nforwarders = [\"10.0.0.9\", \"192.168.0.0/24\"]\n";
    let cfg =
        RelayConfig::load_with_env(&file(&format!("{GOOD}{forwarders}")), env(&[])).expect("loads");
    assert_eq!(cfg.admin.ui.forwarders.len(), 2);
    let e = error_of(&format!("{GOOD}[admin.ui]\nforwarders = [\"::/0\"]\n"), &[]);
    assert!(
        e.contains("forwarders") && e.contains("every address"),
        "{e}"
    );
}
