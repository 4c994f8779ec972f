//! The README's "Run it for real" section, run as written: its shell lines (the
//! `outbox` binary standing in for `cargo install`'s), its `outbox.toml` and its
//! SQL, against the local services. What a shared machine makes necessary is
//! changed, and only that: the schema (other runs share the database) and the
//! HTTP port (another process may hold 9090). A README edit that breaks the path
//! (a setting renamed, a table moved, a step missing) fails here.

use std::path::Path;
use std::time::Duration;

use tokio::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_outbox-e2e-relay");
const README: &str = include_str!("../../README.md");

/// The fenced block after `<!-- first-run: {marker} -->`.
fn block(marker: &str) -> String {
    let tag = format!("<!-- first-run: {marker} -->");
    let at = README
        .find(&tag)
        .unwrap_or_else(|| panic!("the README has no {tag}"));
    let rest = &README[at + tag.len()..];
    let open = rest.find("```").expect("a fenced block follows");
    let body = &rest[open..];
    let body = &body[body.find('\n').expect("fence line") + 1..];
    body[..body.find("```").expect("the block ends")].to_owned()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

async fn curl(url: &str, token: Option<&str>) -> (u16, String) {
    let mut c = Command::new("curl");
    c.args(["-s", "-o", "-", "-w", "\n%{http_code}"]);
    if let Some(t) = token {
        c.args(["-H", &format!("Authorization: Bearer {t}")]);
    }
    let out = c.arg(url).output().await.expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readmes_first_run_works_as_written() {
    let in_ci = std::env::var("CI").is_ok_and(|v| v == "true");
    let shell = block("shell");
    let toml = block("outbox.toml");
    let sql = block("produce.sql");

    let url_line = toml
        .lines()
        .find(|l| l.starts_with("url = \"postgres://"))
        .expect("the config names PostgreSQL");
    let database_url = url_line
        .trim_start_matches("url = \"")
        .trim_end_matches('"')
        .to_owned();
    let pool = match sqlx::PgPool::connect(&database_url).await {
        Ok(p) => p,
        Err(e) if in_ci => {
            panic!("the README's PostgreSQL ({database_url}) is unreachable in CI: {e}")
        }
        Err(e) => {
            eprintln!("SKIPPED (not in CI): {e}");
            return;
        }
    };
    let schema = format!("first_run_{}", std::process::id());
    let port = free_port();
    assert!(toml.contains("schema = \"outbox\"") && toml.contains("127.0.0.1:9090"));
    let toml = toml
        .replace("schema = \"outbox\"", &format!("schema = \"{schema}\""))
        .replace("127.0.0.1:9090", &format!("127.0.0.1:{port}"));
    assert!(sql.contains("outbox.outbox_messages"));
    let sql = sql.replace(
        "outbox.outbox_messages",
        &format!("{schema}.outbox_messages"),
    );

    let dir = std::env::temp_dir().join(&schema);
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::write(dir.join("outbox.toml"), &toml).expect("outbox.toml");

    let mut relay = None;
    for line in shell.lines() {
        let command = line.split("  #").next().unwrap_or("").trim();
        if command.is_empty() {
            continue;
        }
        if let Some(path) = command.strip_prefix("cargo install --locked --path ") {
            // Installing takes minutes; the test's own build of the same command
            // stands in. The path it names must be the package with that binary.
            let manifest = std::fs::read_to_string(
                Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("..")
                    .join(path)
                    .join("Cargo.toml"),
            )
            .expect("the README installs a package of this workspace");
            assert!(
                manifest.contains("name = \"outbox\""),
                "{path} builds no `outbox`"
            );
            continue;
        }
        if let Some(args) = command.strip_prefix("outbox run ") {
            let log = std::fs::File::create(dir.join("run.log")).expect("log");
            relay = Some(
                Command::new(BIN)
                    .arg("run")
                    .args(args.split_whitespace())
                    .current_dir(&dir)
                    .stdout(std::process::Stdio::null())
                    .stderr(log)
                    .kill_on_drop(true)
                    .spawn()
                    .expect("outbox run"),
            );
            continue;
        }
        let out = match command.strip_prefix("outbox ") {
            Some(args) => Command::new(BIN)
                .args(args.split_whitespace())
                .current_dir(&dir)
                .output()
                .await
                .expect("outbox"),
            None => Command::new("sh")
                .args(["-c", command])
                .current_dir(&dir)
                .output()
                .await
                .expect("sh"),
        };
        assert!(
            out.status.success(),
            "`{command}` failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let _relay = relay.expect("the README runs the relay");
    let base = format!("http://127.0.0.1:{port}");
    let mut ready = false;
    for _ in 0..100 {
        if curl(&format!("{base}/readyz"), None).await.0 == 200 {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let log = || std::fs::read_to_string(dir.join("run.log")).unwrap_or_default();
    assert!(ready, "outbox run never became ready: {}", log());

    // SAFETY-SQL: the README's own INSERT (what it tells a user to run), its schema
    // renamed to `first_run_` and digits.
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
        .execute(&pool)
        .await
        .expect("the README's INSERT");
    let mut status = String::new();
    for _ in 0..100 {
        // SAFETY-SQL: `schema` is `first_run_` and digits (the process id).
        status = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT status FROM {schema}.outbox_messages"
        )))
        .fetch_one(&pool)
        .await
        .expect("the message");
        if status == "sent" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(status, "sent", "published: {}", log());

    // Where the README says to look.
    let token = std::fs::read_to_string(dir.join("admin-token")).expect("the token file");
    let token = token.trim();
    let (code, metrics) = curl(&format!("{base}/metrics"), None).await;
    assert_eq!(code, 200);
    assert!(metrics.contains("outbox_published_total 1"), "{metrics}");
    assert_eq!(curl(&format!("{base}/ui/login"), None).await.0, 200);
    let (code, doc) = curl(&format!("{base}/api/v1/openapi.json"), Some(token)).await;
    assert_eq!(code, 200, "{doc}");
    let (code, stats) = curl(&format!("{base}/api/v1/stats"), Some(token)).await;
    assert_eq!(code, 200, "the token file opens the admin API: {stats}");

    drop(_relay);
    // The README's queue holds this run's message: deleted, so runs leave nothing
    // behind on the shared broker (its exchange is declared alike by every run).
    let amqp_url = toml
        .lines()
        .find_map(|l| l.strip_prefix("url = \"amqp://"))
        .map(|rest| format!("amqp://{}", rest.trim_end_matches('"')));
    if let Some(url) = amqp_url
        && let Ok(conn) =
            lapin::Connection::connect(&url, lapin::ConnectionProperties::default()).await
    {
        if let Ok(channel) = conn.create_channel().await {
            let _ = channel
                .queue_delete(
                    "orders.audit".into(),
                    lapin::options::QueueDeleteOptions::default(),
                )
                .await;
        }
        let _ = conn.close(0, "".into()).await;
    }
    let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE")))
        .execute(&pool)
        .await;
    let _ = std::fs::remove_dir_all(&dir);
}
