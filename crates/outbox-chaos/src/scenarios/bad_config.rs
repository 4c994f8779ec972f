//! Runs the `outbox` CLI with bad configuration and bad input; checks that each
//! is refused with a clear message and a non-zero exit, with nothing written and
//! no secret shown.

use std::time::Duration;

use anyhow::Context as _;
use tokio::process::Command;

use super::support::report;
use crate::world::World;
use crate::{Ctx, Report};

/// One bad input at the edge: what is run, and what its refusal must say.
struct BadInput {
    label: &'static str,
    args: Vec<String>,
    config: Option<String>,
    env: Vec<(&'static str, &'static str)>,
    expect: &'static str,
    secret: Option<&'static str>,
}

/// Scenario 10: Bad configuration and bad input: each must be refused with a clear message
/// and a non-zero exit, with nothing written and no secret shown.
pub(crate) async fn bad_config(ctx: &Ctx) -> anyhow::Result<Report> {
    let w = World::new("badcfg", &ctx.urls, &ctx.bins).await?;
    let dir = w.dir.clone();
    let u = &ctx.urls;
    let schema = format!("{}_cfg", w.shop.outbox_schema.as_str());
    let base = |pg: &str, amqp: &str, redis: &str, extra: &str| {
        format!(
            "[adapters]\nstore = \"postgres\"\npublisher = \"rabbitmq\"\nlock = \"redis\"\nsweep_state = \"redis\"\n\
             [postgres]\nurl = \"{pg}\"\nschema = \"{schema}\"\nmigrate_on_start = true\n\
             [rabbitmq]\nurl = \"{amqp}\"\n[redis]\nurl = \"{redis}\"\n{extra}\n[http]\nenabled = false\n"
        )
    };
    let good = base(&u.pg, &u.amqp, &u.redis, "");
    let amqp_wrong = u.amqp.replacen("guest:guest@", "guest:chaos-secret-1@", 1);
    let redis_wrong = u.redis.replacen("redis://", "redis://:chaos-secret-2@", 1);
    let unreachable_pg = u.pg.replacen(":5432/", ":1/", 1);
    let unknown_db = match u.pg.rfind('/') {
        Some(i) => format!("{}/chaos_no_such_db", &u.pg[..i]),
        None => u.pg.clone(),
    };
    let s = |v: &[&str]| v.iter().map(|a| (*a).to_owned()).collect::<Vec<_>>();
    let cases = vec![
        BadInput {
            label: "unknown field",
            args: s(&["migrate"]),
            config: Some(base(&u.pg, &u.amqp, &u.redis, "[dispatch]\nbatchsize = 5")),
            env: vec![],
            expect: "unknown field",
            secret: None,
        },
        BadInput {
            label: "invalid schema identifier",
            args: s(&["migrate"]),
            config: Some(good.replace(
                &format!("schema = \"{schema}\""),
                "schema = \"x; DROP TABLE orders\"",
            )),
            env: vec![],
            expect: "schema",
            secret: None,
        },
        BadInput {
            label: "unreachable PostgreSQL",
            args: s(&["run"]),
            config: Some(base(&unreachable_pg, &u.amqp, &u.redis, "")),
            env: vec![],
            expect: "127.0.0.1:1",
            secret: None,
        },
        BadInput {
            label: "unknown database",
            args: s(&["run"]),
            config: Some(base(&unknown_db, &u.amqp, &u.redis, "")),
            env: vec![],
            expect: "chaos_no_such_db",
            secret: None,
        },
        BadInput {
            label: "wrong RabbitMQ password",
            args: s(&["run"]),
            config: Some(base(&u.pg, &amqp_wrong, &u.redis, "")),
            env: vec![],
            expect: "ACCESS_REFUSED",
            secret: Some("chaos-secret-1"),
        },
        BadInput {
            label: "unreachable RabbitMQ",
            args: s(&["run"]),
            config: Some(base(
                &u.pg,
                &u.amqp.replacen(":5672/", ":1/", 1),
                &u.redis,
                "",
            )),
            env: vec![],
            expect: "broker",
            secret: None,
        },
        BadInput {
            label: "wrong Redis password",
            args: s(&["run"]),
            config: Some(base(&u.pg, &u.amqp, &redis_wrong, "")),
            env: vec![],
            expect: "lock",
            secret: Some("chaos-secret-2"),
        },
        BadInput {
            label: "zero batch size from the environment",
            args: s(&["run"]),
            config: Some(good.clone()),
            env: vec![("OUTBOX__DISPATCH__BATCH_SIZE", "0")],
            expect: "batch_size",
            secret: None,
        },
        BadInput {
            label: "unparsable duration",
            args: s(&["run"]),
            config: Some(base(
                &u.pg,
                &u.amqp,
                &u.redis,
                "[sweep]\ninterval = \"soon\"",
            )),
            env: vec![],
            expect: "soon",
            secret: None,
        },
        BadInput {
            label: "HTTP off loopback without a token",
            args: s(&["run"]),
            config: Some(good.replace(
                "[http]\nenabled = false",
                "[http]\naddress = \"0.0.0.0:19999\"",
            )),
            env: vec![],
            expect: "token",
            secret: None,
        },
        BadInput {
            label: "missing config file",
            args: s(&["run", "--config", "/nonexistent/outbox.toml"]),
            config: None,
            env: vec![],
            expect: "/nonexistent/outbox.toml",
            secret: None,
        },
    ];
    let mut r = report("bad_config");
    let namespaces = "SELECT count(*) FROM pg_namespace";
    for (i, case) in cases.iter().enumerate() {
        r.bad_inputs += 1;
        let before: i64 = sqlx::query_scalar(namespaces).fetch_one(&w.pool).await?;
        let mut cmd = Command::new(&ctx.bins.outbox);
        cmd.args(&case.args);
        if let Some(text) = &case.config {
            let path = dir.join(format!("case{i}.toml"));
            std::fs::write(&path, text)?;
            cmd.arg("--config").arg(&path);
        }
        for (k, v) in &case.env {
            cmd.env(k, v);
        }
        cmd.env("RUST_LOG", "warn").kill_on_drop(true);
        let out = tokio::time::timeout(Duration::from_secs(40), cmd.output())
            .await
            .with_context(|| format!("{}: still running after 40 s", case.label))??;
        let after: i64 = sqlx::query_scalar(namespaces).fetch_one(&w.pool).await?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        let last = stderr
            .lines()
            .rev()
            .find(|l| l.contains("error"))
            .unwrap_or("")
            .to_owned();
        let mut wrong = Vec::new();
        if out.status.success() {
            wrong.push("exit code 0".to_owned());
        }
        if !stderr.contains(case.expect) {
            wrong.push(format!("message lacks {:?}", case.expect));
        }
        if case
            .secret
            .is_some_and(|s| stderr.contains(s) || String::from_utf8_lossy(&out.stdout).contains(s))
        {
            wrong.push("the password was shown".to_owned());
        }
        if after != before {
            wrong.push(format!("{} schema(s) created", after - before));
        }
        if wrong.is_empty() {
            r.refused_clearly += 1;
        } else {
            r.failures
                .push(format!("{}: {} ({last})", case.label, wrong.join(", ")));
        }
        r.notes.push(format!(
            "{} -> exit {}: {}",
            case.label,
            out.status.code().unwrap_or(-1),
            last.chars().take(160).collect::<String>()
        ));
    }
    // Bad input to the dead-message commands of a working deployment.
    let cfg = dir.join("good.toml");
    std::fs::write(&cfg, &good)?;
    let migrate = Command::new(&ctx.bins.outbox)
        .args(["migrate", "--config"])
        .arg(&cfg)
        .output()
        .await?;
    anyhow::ensure!(
        migrate.status.success(),
        "migrate of the good config failed: {}",
        String::from_utf8_lossy(&migrate.stderr)
    );
    for (label, args, expect) in [
        (
            "requeue of a malformed id",
            vec!["dead", "requeue", "not-a-uuid"],
            "not-a-uuid",
        ),
        (
            "delete of an unknown id",
            vec!["dead", "delete", "0190b1a2-0000-7000-8000-000000000000"],
            "no message with id",
        ),
    ] {
        r.bad_inputs += 1;
        let out = Command::new(&ctx.bins.outbox)
            .args(&args)
            .arg("--config")
            .arg(&cfg)
            .output()
            .await?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() && stderr.contains(expect) {
            r.refused_clearly += 1;
        } else {
            r.failures
                .push(format!("{label}: exit {:?}, {stderr}", out.status.code()));
        }
        r.notes.push(format!(
            "{label} -> exit {}: {}",
            out.status.code().unwrap_or(-1),
            stderr.trim().lines().last().unwrap_or("")
        ));
    }
    // SAFETY-SQL: `schema` is a validated schema's name and `_cfg`, quoted.
    let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"
    )))
    .execute(&w.pool)
    .await;
    let passed = r.passed();
    w.cleanup(!passed).await;
    Ok(r)
}
