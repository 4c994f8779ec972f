//! The `outbox` binary as a newcomer runs it.
#![cfg(feature = "cli")]

use std::process::Command;

fn outbox() -> Command {
    Command::new(env!("CARGO_BIN_EXE_outbox"))
}

#[test]
fn demo_ends_with_one_summary_line_and_nothing_lost() {
    let out = outbox()
        .args(["demo", "--quiet"])
        .output()
        .expect("run outbox demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "exit {:?}\nstdout: {stdout}\nstderr: {stderr}",
        out.status
    );
    let lines: Vec<_> = stdout.lines().collect();
    assert_eq!(
        lines,
        ["demo: 1000 enqueued, 1000 sent, 1000 consumed, 0 dead, 0 lost"],
        "stderr: {stderr}"
    );
    assert!(
        stderr.contains("publish failures"),
        "details go to stderr: {stderr}"
    );
    assert!(stderr.contains("0 duplicate effects"), "{stderr}");
}

#[test]
fn demo_counts_poison_messages_as_dead_not_lost() {
    let out = outbox()
        .args(["demo", "--quiet", "--messages", "200", "--poison", "4"])
        .output()
        .expect("run outbox demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout.trim(),
        "demo: 200 enqueued, 200 sent, 196 consumed, 4 dead, 0 lost"
    );
}

#[test]
fn bad_arguments_are_clear_errors() {
    let out = outbox()
        .args(["demo", "--messages", "0"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2), "a usage error");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--messages must be at least 1"), "{stderr}");
    assert!(out.stdout.is_empty());
    let out = outbox()
        .args([
            "demo",
            "--messages",
            "3",
            "--poison",
            "2",
            "--dead-publish",
            "2",
        ])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--dead-publish"));

    let out = outbox()
        .args(["demo", "--timeout", "soon"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid duration"));

    let out = outbox().args(["frobnicate"]).output().expect("run");
    assert_eq!(out.status.code(), Some(2));
}

/// `outbox.example.toml` with its PostgreSQL URL replaced by `url`, in a file of
/// its own.
fn example_with_postgres(url: &str) -> std::path::PathBuf {
    static FILES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let example = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../outbox.example.toml"
    ))
    .expect("the example config");
    let theirs = "postgres://postgres@127.0.0.1:5432/test";
    assert!(example.contains(theirs), "the example's URL is {theirs}");
    // A schema of this run's own: the example's `outbox` would keep what an
    // earlier build migrated (a migration changed since would then be refused).
    let n = FILES.load(std::sync::atomic::Ordering::SeqCst);
    let text = example.replace(theirs, url).replace(
        "schema = \"outbox\"",
        &format!("schema = \"cli_{}_{n}\"", std::process::id()),
    );
    assert!(
        text.contains("schema = \"cli_"),
        "the example's schema is `outbox`"
    );
    let path = std::env::temp_dir().join(format!(
        "outbox-cli-{}-{}.toml",
        std::process::id(),
        FILES.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
    ));
    std::fs::write(&path, text).expect("write");
    path
}

#[test]
fn migrate_against_a_closed_port_says_refused_within_5_seconds() {
    // A port nothing listens on: bound, then released.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let cfg = example_with_postgres(&format!("postgres://postgres:pw@127.0.0.1:{port}/test"));
    let started = std::time::Instant::now();
    let out = outbox()
        .args(["migrate", "--config"])
        .arg(&cfg)
        .output()
        .expect("run");
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        took < std::time::Duration::from_secs(5),
        "took {took:?}: {stderr}"
    );
    assert!(
        stderr.contains("connection refused") && stderr.contains(&format!("127.0.0.1:{port}")),
        "{stderr}"
    );
    assert!(!stderr.contains("pool timed out"), "{stderr}");
    assert!(!stderr.contains(":pw@"), "no password shown: {stderr}");
}

#[test]
fn migrate_names_a_role_that_cannot_sign_in_and_runs_twice_without_notices() {
    let base = std::env::var("OUTBOX_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let wrong = base.replacen("postgres://postgres", "postgres://no_such_role_here", 1);
    assert_ne!(wrong, base, "the test URL names the postgres role");
    let cfg = example_with_postgres(&wrong);
    let out = outbox()
        .args(["migrate", "--config"])
        .arg(&cfg)
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("no_such_role_here") && stderr.contains("retrying will not help"),
        "{stderr}"
    );
    assert!(!stderr.contains("(retryable)"), "{stderr}");

    let cfg = example_with_postgres(&base);
    for run in 0..2 {
        let out = outbox()
            .args(["migrate", "--config"])
            .arg(&cfg)
            .output()
            .expect("run");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        assert!(
            !stderr.contains("NOTICE") && !stderr.contains("notice"),
            "run {run}: {stderr}"
        );
        assert!(stderr.contains("migrated schema"), "{stderr}");
    }
}

#[test]
fn demo_dead_publish_ends_dead_on_the_publish_side() {
    let out = outbox()
        .args([
            "demo",
            "--quiet",
            "--messages",
            "200",
            "--dead-publish",
            "3",
            "--poison",
            "2",
        ])
        .output()
        .expect("run outbox demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout.trim(),
        "demo: 200 enqueued, 197 sent, 195 consumed, 5 dead, 0 lost"
    );
}
