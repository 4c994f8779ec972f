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
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--messages must be at least 1"), "{stderr}");
    assert!(out.stdout.is_empty());

    let out = outbox()
        .args(["demo", "--timeout", "soon"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid duration"));

    let out = outbox().args(["frobnicate"]).output().expect("run");
    assert_eq!(out.status.code(), Some(2));
}
