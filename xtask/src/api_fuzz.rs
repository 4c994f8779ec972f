//! `cargo xtask api-fuzz`: Schemathesis against the live admin API of a real
//! `outbox run` (PostgreSQL store in a schema of its own, RabbitMQ publisher), with
//! a write token, with every check Schemathesis has (`--checks all`): no generated
//! input may get a 5xx, every response must match the OpenAPI document the API
//! serves (status, content type, headers, schema), input the document forbids must
//! get a 4xx and input it allows must not, auth must not be ignored, a deleted
//! resource must be gone. No check is excluded: each applies and passes.
//! `ci` runs it after the fault suite.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{run, set_service_defaults};

/// The token the run uses (a throwaway: the relay lives for this run only).
const TOKEN: &str = "api-fuzz-write-token-0123456789";

/// Stops the relay and removes its schema when the run ends, also on failure.
struct Relay {
    child: Child,
    schema: String,
    database_url: String,
}

impl Drop for Relay {
    fn drop(&mut self) {
        // SIGTERM first (a clean stop), then make sure.
        let _ = Command::new("kill")
            .arg(self.child.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = psql(
            &self.database_url,
            &format!(
                "SET client_min_messages = warning; DROP SCHEMA IF EXISTS {} CASCADE",
                self.schema
            ),
        );
    }
}

/// Runs `sql` with psql against `database_url`.
fn psql(database_url: &str, sql: &str) -> Result<(), String> {
    let out = Command::new("psql")
        .args([database_url, "-q", "-v", "ON_ERROR_STOP=1", "-c", sql])
        .output()
        .map_err(|e| format!("api-fuzz: cannot run psql: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "api-fuzz: psql failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Something to find: messages in each status, deliveries of two consumers and a
/// dead letter, so the generated requests meet real rows, not only 404s.
fn seed_sql(schema: &str) -> String {
    format!(
        "SET search_path = {schema};
         INSERT INTO outbox_messages (exchange, routing_key, message_type, payload, status, attempts, last_error, correlation_id)
           SELECT 'api-fuzz-nowhere', 'k.' || n, 'fuzz.seeded', convert_to('{{\"n\": ' || n || '}}', 'UTF8'),
                  (ARRAY['dead', 'publish_failed', 'dead'])[1 + n % 3], 3, 'seeded', 'corr-' || n
           FROM generate_series(1, 30) AS n;
         INSERT INTO outbox_inbox (consumer, message_id, exchange, routing_key, payload, created_at, status, attempts, consumed_at)
           SELECT c, id, exchange, routing_key, payload, created_at,
                  CASE WHEN c = 'billing' THEN 'dead' ELSE 'consumed' END, 1,
                  CASE WHEN c = 'billing' THEN NULL ELSE now() END
           FROM outbox_messages, (VALUES ('billing'), ('shipping')) AS v(c);
         INSERT INTO outbox_dead_letters (consumer, message_id, routing_key, body, reason)
           VALUES ('billing', NULL, 'k', '\\xfffe'::bytea, 'seeded: no message id');"
    )
}

fn env_or(var: &str, default: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| default.to_owned())
}

fn free_port() -> Result<u16, String> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("api-fuzz: no free port: {e}"))
}

/// Runs Schemathesis against a relay started from the debug build of `outbox`.
pub(crate) fn api_fuzz() -> Result<(), String> {
    run(
        "build",
        crate::cargo().args(["build", "-p", "outbox-cli", "--bin", "outbox"]),
    )?;
    let found = Command::new("schemathesis").arg("--version").output();
    if !found.is_ok_and(|o| o.status.success()) {
        return Err(
            "api-fuzz needs Schemathesis: `python3 -m pip install schemathesis` (.ci/run installs it)"
                .to_owned(),
        );
    }
    let target = env_or("CARGO_TARGET_DIR", "target");
    let dir = format!("{target}/api-fuzz");
    std::fs::create_dir_all(&dir).map_err(|e| format!("api-fuzz: {dir}: {e}"))?;
    let database_url = env_or(
        "OUTBOX_TEST_DATABASE_URL",
        "postgres://postgres@127.0.0.1:5432/test",
    );
    let amqp_url = env_or(
        "OUTBOX_TEST_AMQP_URL",
        "amqp://guest:guest@127.0.0.1:5672/%2f",
    );
    let schema = format!("api_fuzz_{}", std::process::id());
    let port = free_port()?;
    let config = format!(
        r#"[adapters]
store = "postgres"
publisher = "rabbitmq"
lock = "postgres"
sweep_state = "postgres"
[postgres]
url = "{database_url}"
schema = "{schema}"
migrate_on_start = true
[rabbitmq]
url = "{amqp_url}"
[http]
address = "127.0.0.1:{port}"
[admin]
allow_edit = true
[[admin.tokens]]
name = "api-fuzz"
secret = "{TOKEN}"
role = "write"
"#
    );
    let config_path = format!("{dir}/outbox.toml");
    std::fs::write(&config_path, config).map_err(|e| format!("api-fuzz: {e}"))?;
    let log =
        std::fs::File::create(format!("{dir}/relay.log")).map_err(|e| format!("api-fuzz: {e}"))?;
    let mut cmd = Command::new(format!("{target}/debug/outbox"));
    cmd.args(["run", "--config", &config_path])
        .stdout(Stdio::null())
        .stderr(log);
    set_service_defaults(&mut cmd);
    let child = cmd
        .spawn()
        .map_err(|e| format!("api-fuzz: cannot start outbox run: {e}"))?;
    let relay = Relay {
        child,
        schema,
        database_url,
    };
    let base = format!("http://127.0.0.1:{port}");
    let schema = relay.schema.clone();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let up = Command::new("curl")
            .args(["-sf", "-o", "/dev/null", &format!("{base}/healthz")])
            .status()
            .is_ok_and(|s| s.success());
        if up {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!(
                "api-fuzz: outbox run did not answer on {base} within 60 s (see {dir}/relay.log)"
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    // The relay has migrated its schema by now (it answers only after).
    psql(&relay.database_url, &seed_sql(&schema))?;
    // Seed 1 keeps CI's run the same from run to run; another seed explores.
    let seed = env_or("OUTBOX_API_FUZZ_SEED", "1");
    let result = run(
        "schemathesis",
        Command::new("schemathesis").args([
            "run",
            &format!("{base}/api/v1/openapi.json"),
            "--url",
            &format!("{base}/api/v1"),
            "--header",
            &format!("Authorization: Bearer {TOKEN}"),
            "--checks",
            "all",
            "--max-examples",
            "40",
            "--workers",
            "1",
            "--seed",
            &seed,
            "--report",
            "junit",
            "--report-dir",
            &dir,
        ]),
    );
    drop(relay);
    result
}
