//! The effective settings as `outbox run` logs them at start: one line a section,
//! durations as they are written in the file (`1m`, `500ms`), secrets never (URLs
//! without their passwords, tokens counted and named, never shown).

use outbox_core::config::redact_url;
use outbox_core::duration::format as d;

use crate::config::RelayConfig;

/// `(section, its settings)` for each section in use.
#[must_use]
pub fn settings_lines(cfg: &RelayConfig) -> Vec<(&'static str, String)> {
    let mut lines = Vec::new();
    let a = &cfg.adapters;
    lines.push((
        "adapters",
        format!(
            "store={:?} publisher={:?} lock={:?} sweep_state={:?}",
            a.store, a.publisher, a.lock, a.sweep_state
        )
        .to_lowercase(),
    ));
    if let Some(pg) = &cfg.postgres {
        lines.push((
            "postgres",
            format!(
                "url={} schema={} max_connections={} migrate_on_start={} statement_timeout={} lock_timeout={} keepalive={}/{}x{}",
                redact_url(&pg.url),
                pg.schema,
                pg.max_connections,
                pg.migrate_on_start,
                d(pg.statement_timeout),
                d(pg.lock_timeout),
                d(pg.keepalive_idle),
                d(pg.keepalive_interval),
                pg.keepalive_count
            ),
        ));
    }
    if let Some(r) = &cfg.rabbitmq {
        let nodes: Vec<String> = r.nodes().iter().map(|u| redact_url(u)).collect();
        lines.push((
            "rabbitmq",
            format!(
                "nodes={} confirm_timeout={} max_in_flight={} tls_ca_file={} client_cert={}",
                nodes.join(","),
                d(r.confirm_timeout),
                r.max_in_flight,
                r.tls_ca_file
                    .as_ref()
                    .map_or("none".into(), |p| p.display().to_string()),
                if r.tls_client_cert_file.is_some() {
                    "set"
                } else {
                    "none"
                }
            ),
        ));
    }
    if let Some(r) = &cfg.redis {
        lines.push(("redis", format!("url={}", redact_url(&r.url))));
    }
    let x = &cfg.dispatch;
    lines.push((
        "dispatch",
        format!(
            "batch_size={} lease_ttl={} idle_poll={} error_backoff={} pipelines={}",
            x.batch_size,
            d(x.lease_ttl),
            d(x.idle_poll),
            d(x.error_backoff),
            x.pipelines
        ),
    ));
    let r = &cfg.retry;
    lines.push((
        "retry",
        format!(
            "initial_backoff={} max_backoff={} max_attempts={}",
            d(r.initial_backoff),
            d(r.max_backoff),
            r.max_attempts
        ),
    ));
    let s = &cfg.sweep;
    lines.push((
        "sweep",
        format!(
            "interval={} batch_size={} max_batches_per_sweep={} lock_wait={} lock_ttl={} state_ttl={} lock_key={} state_key={}",
            d(s.interval),
            s.batch_size,
            s.max_batches_per_sweep,
            d(s.lock_wait),
            d(s.lock_ttl),
            d(s.state_ttl),
            s.lock_key,
            s.state_key
        ),
    ));
    let t = &cfg.retention;
    lines.push((
        "retention",
        format!(
            "enabled={} sent_after={} interval={} batch_size={} vacuum={:?}",
            t.enabled,
            d(t.sent_after),
            d(t.interval),
            t.batch_size,
            t.vacuum
        )
        .replace("vacuum=Auto", "vacuum=auto")
        .replace("vacuum=Never", "vacuum=never"),
    ));
    let h = &cfg.http;
    lines.push((
        "http",
        format!(
            "enabled={} address={} token={} stall_after={}",
            h.enabled,
            h.address,
            if h.token.is_some() { "set" } else { "none" },
            d(cfg.health.stall_after)
        ),
    ));
    let names: Vec<&str> = cfg.admin.tokens.iter().map(|t| t.name.as_str()).collect();
    lines.push((
        "admin",
        if names.is_empty() {
            "closed (no token)".to_owned()
        } else {
            format!("tokens={} ({})", names.len(), names.join(","))
        },
    ));
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_line_is_readable_and_no_secret_shows() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../outbox.example.toml");
        let env = [
            (
                "OUTBOX__POSTGRES__URL".to_owned(),
                // A password may also come in the query (issue 47).
                "postgres://app:pg-secret-1@db:5432/shop?sslmode=require&SSLPassword=pg-secret-4"
                    .to_owned(),
            ),
            (
                "OUTBOX__RABBITMQ__URL".to_owned(),
                "amqp://app:mq-secret-2@mq:5672/%2f?heartbeat=10&password=mq-secret-5".to_owned(),
            ),
            (
                "OUTBOX__HTTP__TOKEN".to_owned(),
                "http-secret-3-long-enough".to_owned(),
            ),
        ];
        let cfg = RelayConfig::load_with_env(std::path::Path::new(path), env).expect("loads");
        let lines = settings_lines(&cfg);
        let text: Vec<String> = lines.iter().map(|(s, l)| format!("{s}: {l}")).collect();
        let all = text.join("\n");
        let debug = format!("{cfg:?}");
        for secret in [
            "pg-secret-1",
            "mq-secret-2",
            "http-secret-3",
            "pg-secret-4",
            "mq-secret-5",
        ] {
            assert!(!all.contains(secret), "{secret} shows:\n{all}");
            assert!(!debug.contains(secret), "{secret} shows in Debug:\n{debug}");
        }
        for expected in [
            "adapters: store=postgres publisher=rabbitmq lock=redis sweep_state=redis",
            "url=postgres://app:***@db:5432/shop?sslmode=require&SSLPassword=***",
            "sweep: interval=1m",
            "dispatch: batch_size=500 lease_ttl=1m",
            "retention: enabled=true sent_after=7d",
            "token=set",
            "admin: closed (no token)",
        ] {
            assert!(all.contains(expected), "{expected:?} missing:\n{all}");
        }
        assert!(
            !all.contains("Duration") && !all.contains('{'),
            "no struct dump:\n{all}"
        );
    }
}
