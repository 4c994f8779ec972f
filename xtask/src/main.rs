//! Project automation, run as `cargo xtask <command>` (alias in `.cargo/config.toml`).
//!
//! - `ci`: everything CI checks: formatting, clippy with warnings denied (also on
//!   `outbox-app` and the facade without default features, and a check with each of
//!   their features alone), the dependency guard, and the whole test suite.
//! - `guard`: the dependency guard alone (the architecture invariants that a
//!   dependency graph can prove), and every path ARCHITECTURE.md's code map names
//!   exists ([`code_map_problems`] has the rule), and no modules of a library crate
//!   import each other in a circle (`module_cycles`, issue 31).
//! - `it`: only the tests that need the real PostgreSQL, RabbitMQ and Redis (URLs
//!   from `OUTBOX_TEST_*`, else the local defaults). `ci` runs them too, once. Both
//!   start the local RabbitMQ cluster (`cluster up`) for the tests that need several
//!   nodes, and stop it after them, unless `OUTBOX_TEST_CLUSTER_URLS` names one.
//! - `bench [--quick]`: builds release binaries and runs `outbox-bench`, which prints
//!   a table and writes `target/bench/summary.json` (see BENCHMARKS.md).
//! - `chaos [--quick] [--only NAME,...]`: builds the debug binaries and runs the fault
//!   suite `outbox-chaos`, which stops and starts the local services, prints a table
//!   and writes `target/chaos/summary.json` (see RELIABILITY.md). `ci` runs the quick
//!   subset after the tests. `chaos --generative [--seed N] [--duration D]`: the
//!   generative checker instead (random workloads from a seed, every message's fate
//!   checked; `target/chaos/generative.json`); `ci` runs it for 3 minutes after the
//!   quick subset.
//! - `soak [--duration 60m] [--rate 1000] [--seed N]`: builds the debug binaries and
//!   runs the endurance run `outbox-chaos soak`: two relays and two consumers under
//!   steady traffic with random faults (it stops and starts the local services),
//!   writing `target/soak/summary.json` and `target/soak/soak.svg` (see
//!   RELIABILITY.md). Not part of `ci`. `soak --generative [--duration 60m] [--seed
//!   N]`: the generative checker's rounds for an hour (or `--duration`).
//! - `api-fuzz`: Schemathesis (from PyPI; `.ci/run` installs it) against the admin
//!   API of a live `outbox run`: no 5xx for any generated input, every response as
//!   documented. `ci` runs it last.
//! - `ui-test [--docs DIR]`: the dashboard's browser tests, headless Debian
//!   `chromium` through `chromedriver` (`.ci/run` installs both); a screenshot of a
//!   failure under `target/ui-screenshots/`. `ci` runs it after the tests.
//! - `cluster up | down | status`: a local 3-node RabbitMQ cluster (AMQP on 5681, 5682,
//!   5683) from the machine's RabbitMQ, for what needs more than one broker node; the
//!   node on 5672 is never touched (see `cluster`).
//!
//! Only the standard library is used, so that xtask builds fast and never breaks.

mod api_fuzz;
mod cluster;
mod glob_reexports;
mod module_cycles;
mod ui_test;

use std::path::Path;
use std::process::{Command, ExitCode};

/// The facade's features, each checked alone by `ci`.
const FACADE_FEATURES: &[&str] = &[
    "postgres",
    "rabbitmq",
    "redis",
    "memory",
    "admin",
    "otel",
    "telemetry",
];

/// `outbox-app`'s optional features, each with the crates it alone may bring. With
/// no features, none of these crates is a dependency; with one feature, only its
/// own, and those of the features it turns on ([`APP_FEATURE_IMPLIES`]; `cli` turns
/// on every feature but `otel`). A crate two features share is in both stacks.
const APP_FEATURE_STACKS: &[(&str, &[&str])] = &[
    (
        "postgres",
        &[
            "outbox-adapters-postgres",
            "sqlx",
            "sqlx-core",
            "sqlx-postgres",
        ],
    ),
    (
        "rabbitmq",
        &["outbox-adapters-rabbitmq", "lapin", "amq-protocol"],
    ),
    ("memory", &["outbox-adapters-memory"]),
];

/// Features of `outbox-app` that turn on others: alone, such a feature may bring
/// the stacks of these too (none today).
const APP_FEATURE_IMPLIES: &[(&str, &[&str])] = &[];

/// Crates that do I/O or bring a runtime; the pure core must not reach any of them.
const IO_CRATES: &[&str] = &[
    "tokio",
    "async-std",
    "smol",
    "mio",
    "sqlx",
    "lapin",
    "redis",
    "deadpool",
    "deadpool-redis",
    "reqwest",
    "hyper",
    "axum",
    "socket2",
];

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("ci") => ci(),
        Some("guard") => guard(),
        Some("it") => it(),
        Some("bench") => bench(args.iter().any(|a| a == "--quick")),
        Some("chaos") => chaos(&args[1..]),
        Some("soak") => soak(&args[1..]),
        Some("api-fuzz") => api_fuzz::api_fuzz(),
        Some("ui-test") => ui_test::ui_test(&args[1..]),
        Some("cluster") => cluster::cluster(&args[1..]),
        _ => {
            eprintln!(
                "usage: cargo xtask <ci|guard|it|bench [--quick]|chaos [--quick] [--only NAME,...] [--generative [--seed N] [--duration D]]|soak [--duration 60m] [--rate 1000] [--seed N] [--generative]|api-fuzz|ui-test [--docs DIR]|cluster <up|down|status>>\n\n  ci     fmt check, clippy -D warnings, dependency guard, all tests, quick chaos, api-fuzz\n  guard  dependency guard, the paths of ARCHITECTURE.md's code map, circles of modules\n  it     tests against the real PostgreSQL, RabbitMQ and Redis only\n  bench  the relay side by side with the raw limits (target/bench/summary.json)\n  chaos  the fault suite against the local services (target/chaos/summary.json);\n         --generative: random workloads from a seed, every message checked (generative.json)\n  soak   an endurance run with random faults (target/soak/summary.json, soak.svg)\n  api-fuzz  Schemathesis against the admin API of a live `outbox run`\n  ui-test  the dashboard's browser tests in headless chromium (target/ui-screenshots on failure)\n  cluster  a local 3-node RabbitMQ cluster on 5681-5683 (up, down, status)"
            );
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}

pub(crate) fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned()))
}

pub(crate) fn run(step: &str, cmd: &mut Command) -> Result<(), String> {
    eprintln!("xtask: {step}: {cmd:?}");
    let status = cmd
        .status()
        .map_err(|e| format!("{step}: cannot start: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{step} failed ({status})"))
    }
}

fn ci() -> Result<(), String> {
    let in_ci = std::env::var("CI").is_ok_and(|v| v == "true");
    eprintln!("xtask: ci (CI={})", if in_ci { "true" } else { "unset" });
    run("format", cargo().args(["fmt", "--all", "--", "--check"]))?;
    run(
        "clippy",
        cargo().args([
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ]),
    )?;
    // The gating must keep compiling, lints included, with no features and with
    // each feature alone, not only with the defaults every other step uses.
    run(
        "clippy (outbox-app without default features)",
        cargo().args([
            "clippy",
            "-p",
            "outbox-app",
            "--no-default-features",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ]),
    )?;
    for (feature, _) in APP_FEATURE_STACKS {
        run(
            &format!("check (outbox-app with feature {feature} alone)"),
            cargo().args([
                "check",
                "-p",
                "outbox-app",
                "--no-default-features",
                "--features",
                feature,
                "--all-targets",
            ]),
        )?;
    }
    // The facade likewise: without features (no driver at all) and with each
    // feature alone, so a user's `default-features = false` plus one backend builds.
    run(
        "clippy (outbox without default features)",
        cargo().args([
            "clippy",
            "-p",
            "outbox",
            "--no-default-features",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ]),
    )?;
    for feature in FACADE_FEATURES {
        run(
            &format!("check (outbox with feature {feature} alone)"),
            cargo().args([
                "check",
                "-p",
                "outbox",
                "--no-default-features",
                "--features",
                feature,
                "--all-targets",
            ]),
        )?;
    }
    // No Docker engine here: the containers path is compiled and linted, and its
    // choice logic unit-tested with the rest (outbox_testkit::containers).
    run(
        "clippy (outbox-testkit with feature containers)",
        cargo().args([
            "clippy",
            "-p",
            "outbox-testkit",
            "--features",
            "containers",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ]),
    )?;
    guard()?;
    // The tests and chaos scenarios that need several broker nodes get a local
    // cluster, stopped again after the chaos suite (also when anything failed).
    let cluster = cluster::ForTests::start()?;
    let tested = run(
        "tests",
        cargo()
            .args(["test", "--workspace", "--all-targets"])
            .env("OUTBOX_TEST_CLUSTER_URLS", &cluster.urls),
    )
    .and_then(|()| run("doc tests", cargo().args(["test", "--workspace", "--doc"])))
    .and_then(|()| ui_test::ui_test(&[]))
    .and_then(|()| chaos_on(&["--quick".to_owned()], &cluster))
    // The generative checker (issue 47): random workloads for 3 minutes, the
    // seeds that once failed first.
    .and_then(|()| {
        chaos_on(
            &["--generative", "--duration", "3m"].map(str::to_owned),
            &cluster,
        )
    });
    drop(cluster);
    tested?;
    api_fuzz::api_fuzz()?;
    eprintln!("xtask: ci passed");
    Ok(())
}

fn bench(quick: bool) -> Result<(), String> {
    run(
        "build",
        cargo().args([
            "build",
            "--release",
            "-p",
            "outbox-cli",
            "-p",
            "outbox-bench",
        ]),
    )?;
    // Where cargo put them (a shared CARGO_TARGET_DIR too, as `chaos` reads it); the
    // summary still goes to ./target/bench.
    let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".to_owned());
    let mut cmd = Command::new(format!("{target}/release/outbox-bench"));
    cmd.arg("--relay-bin")
        .arg(format!("{target}/release/outbox"));
    if quick {
        cmd.arg("--quick");
    }
    run("bench", &mut cmd)
}

/// Builds the relay, the example consumer and the fault suite (debug, reusing what
/// the tests built) and runs the suite with `args`, on a local cluster for the
/// scenarios that need one (started now and stopped afterwards, unless
/// `OUTBOX_TEST_CLUSTER_URLS` names one).
fn chaos(args: &[String]) -> Result<(), String> {
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1));
    let help = args.iter().any(|a| a == "--help" || a == "-h");
    let generative = args.iter().any(|a| a == "--generative");
    // Starting three nodes takes a minute: only for a run with a cluster scenario.
    let needed = !help
        && !generative
        && only.is_none_or(|o| o.split(',').any(|n| n.starts_with("cluster_")));
    let cluster = if needed {
        cluster::ForTests::start()?
    } else {
        cluster::ForTests::none()
    };
    chaos_on(args, &cluster)
}

/// As [`chaos`], on `cluster`. The suite restarts a node it killed through this
/// xtask binary (`OUTBOX_XTASK`).
fn chaos_on(args: &[String], cluster: &cluster::ForTests) -> Result<(), String> {
    run(
        "build",
        cargo().args([
            "build",
            "-p",
            "outbox-cli",
            "-p",
            "outbox-examples",
            "-p",
            "outbox-chaos",
        ]),
    )?;
    let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".to_owned());
    let mut cmd = Command::new(format!("{target}/debug/outbox-chaos"));
    cmd.args(args)
        .env("OUTBOX_TEST_CLUSTER_URLS", &cluster.urls);
    if let Ok(me) = std::env::current_exe() {
        cmd.env("OUTBOX_XTASK", me);
    }
    set_service_defaults(&mut cmd);
    run("chaos", &mut cmd)
}

const SOAK_USAGE: &str = "usage: cargo xtask soak [--duration 60m] [--rate 1000] [--seed N] [--release]\n       cargo xtask soak --generative [--duration 60m] [--seed N]\n\n  two relays and two consumers against the local services, orders at --rate a second\n  for --duration (90s, 3m, 60m, ...), faults every 2 minutes on average from a seeded\n  schedule; writes target/soak/summary.json, samples.json and soak.svg (RELIABILITY.md);\n  --release builds and runs the optimised binaries (debug by default);\n  --generative: the generative checker's rounds for --duration (an hour by default),\n  as `cargo xtask chaos --generative` runs them (target/chaos/generative.json)";

/// The arguments of `soak`, checked before anything is built: each flag once, with
/// a value. `Ok(false)`: `--help`.
fn soak_args_ok(args: &[String]) -> Result<bool, String> {
    let mut seen: Vec<&str> = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--help" | "-h" => return Ok(false),
            "--release" if !seen.contains(&"--release") => seen.push("--release"),
            "--generative" if !seen.contains(&"--generative") => seen.push("--generative"),
            "--duration" | "--rate" | "--seed" => {
                if seen.contains(&a.as_str()) {
                    return Err(format!("{a} given twice"));
                }
                seen.push(a);
                if it.next().is_none() {
                    return Err(format!("{a} needs a value"));
                }
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(true)
}

/// Builds the relay, the example consumer and the fault suite (debug) and runs the
/// soak with `args` (the soak copies the binaries it runs first).
fn soak(args: &[String]) -> Result<(), String> {
    match soak_args_ok(args) {
        Ok(true) => {}
        Ok(false) => {
            eprintln!("{SOAK_USAGE}");
            return Ok(());
        }
        Err(e) => return Err(format!("soak: {e}\n{SOAK_USAGE}")),
    }
    let release = args.iter().any(|a| a == "--release");
    if args.iter().any(|a| a == "--generative") {
        if release || args.iter().any(|a| a == "--rate") {
            return Err(format!(
                "soak: --generative takes --duration and --seed only\n{SOAK_USAGE}"
            ));
        }
        // The generative checker for an hour unless told otherwise.
        let mut with = args.to_vec();
        if !args.iter().any(|a| a == "--duration") {
            with.extend(["--duration".to_owned(), "60m".to_owned()]);
        }
        return chaos_on(&with, &cluster::ForTests::none());
    }
    let mut build = cargo();
    build.args([
        "build",
        "-p",
        "outbox-cli",
        "-p",
        "outbox-examples",
        "-p",
        "outbox-chaos",
    ]);
    if release {
        build.arg("--release");
    }
    run("build", &mut build)?;
    let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".to_owned());
    let profile = if release { "release" } else { "debug" };
    let mut cmd = Command::new(format!("{target}/{profile}/outbox-chaos"));
    cmd.arg("soak")
        .args(args.iter().filter(|a| *a != "--release"));
    set_service_defaults(&mut cmd);
    run("soak", &mut cmd)
}

/// Packages whose tests talk to the real services.
const SERVICE_PACKAGES: &[&str] = &[
    "outbox-adapters-postgres",
    "outbox-adapters-redis",
    "outbox-adapters-rabbitmq",
    "outbox-consumer",
    "outbox-e2e",
];

fn it() -> Result<(), String> {
    let mut cmd = cargo();
    cmd.arg("test");
    for p in SERVICE_PACKAGES {
        cmd.args(["-p", p]);
    }
    set_service_defaults(&mut cmd);
    let cluster = cluster::ForTests::start()?;
    cmd.env("OUTBOX_TEST_CLUSTER_URLS", &cluster.urls);
    run("integration tests", &mut cmd)
}

/// The `OUTBOX_TEST_*` URLs, defaulting to the local servers.
pub(crate) fn set_service_defaults(cmd: &mut Command) {
    for (var, default) in [
        (
            "OUTBOX_TEST_DATABASE_URL",
            "postgres://postgres@127.0.0.1:5432/test",
        ),
        (
            "OUTBOX_TEST_AMQP_URL",
            "amqp://guest:guest@127.0.0.1:5672/%2f",
        ),
        ("OUTBOX_TEST_REDIS_URL", "redis://127.0.0.1:6379/"),
    ] {
        if std::env::var_os(var).is_none() {
            cmd.env(var, default);
        }
    }
}

/// Normal (non-dev, non-build) dependencies of `package`, by crate name.
fn normal_deps(package: &str) -> Result<Vec<String>, String> {
    normal_deps_with(package, &[])
}

/// As [`normal_deps`], with extra `cargo tree` arguments (feature selection).
fn normal_deps_with(package: &str, extra: &[&str]) -> Result<Vec<String>, String> {
    let out = cargo()
        .args([
            "tree", "--quiet", "-p", package, "-e", "normal", "--prefix", "none",
        ])
        .args(extra)
        .output()
        .map_err(|e| format!("cargo tree: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "cargo tree -p {package} {} failed: {}",
            extra.join(" "),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let mut deps: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != package)
        .map(str::to_owned)
        .collect();
    deps.sort();
    deps.dedup();
    Ok(deps)
}

fn workspace_packages() -> Result<Vec<String>, String> {
    let entries = std::fs::read_dir("crates").map_err(|e| format!("reading crates/: {e}"))?;
    let mut names: Vec<String> = entries
        .filter_map(Result::ok)
        .filter(|e| e.path().join("Cargo.toml").exists())
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    names.sort();
    Ok(names)
}

fn guard() -> Result<(), String> {
    let mut problems = Vec::new();
    for pure in ["outbox-core", "outbox-ports"] {
        let deps = normal_deps(pure)?;
        for bad in deps.iter().filter(|d| IO_CRATES.contains(&d.as_str())) {
            problems.push(format!(
                "{pure} depends on {bad}: it must stay free of I/O and runtimes"
            ));
        }
    }
    let core = normal_deps("outbox-core")?;
    for own in core.iter().filter(|d| d.starts_with("outbox-")) {
        problems.push(format!(
            "outbox-core depends on {own}: the core depends on no other crate of ours"
        ));
    }
    let packages = workspace_packages()?;
    for adapter in packages
        .iter()
        .filter(|p| p.starts_with("outbox-adapters-"))
    {
        let deps = normal_deps(adapter)?;
        for other in deps
            .iter()
            .filter(|d| d.starts_with("outbox-adapters-") || *d == "outbox-app")
        {
            problems.push(format!(
                "{adapter} depends on {other}: adapters depend on core and ports only"
            ));
        }
    }
    // The admin API is mounted into any axum service and used by the CLI over any
    // store: it reaches the stores through the ports only.
    let admin = normal_deps("outbox-admin")?;
    for bad in admin.iter().filter(|d| {
        d.starts_with("outbox-adapters-")
            || *d == "outbox-app"
            || ["sqlx", "lapin", "redis", "deadpool-redis"].contains(&d.as_str())
    }) {
        problems.push(format!(
            "outbox-admin depends on {bad}: it reaches the stores through the ports only"
        ));
    }
    problems.extend(layering_problems()?);
    problems.extend(app_feature_problems()?);
    problems.extend(tls_problems()?);
    problems.extend(code_map_problems()?);
    problems.extend(module_cycles::module_cycle_problems()?);
    problems.extend(glob_reexports::glob_reexport_problems()?);
    if problems.is_empty() {
        eprintln!(
            "xtask: guard passed (outbox-core: {} normal dependencies, none doing I/O; adapters independent; outbox-admin on ports only; clap, config and anyhow in outbox-cli only; the facade without features pulls no driver; one binary `outbox`; outbox-app's features bring only their own stacks; TLS on rustls with ring only, no OpenSSL; every path of ARCHITECTURE.md's code map exists; no new circle of modules in a library crate; no glob re-export at the root of a crate users depend on)",
            core.len()
        );
        Ok(())
    } else {
        Err(format!(
            "dependency guard failed:\n  {}",
            problems.join("\n  ")
        ))
    }
}

/// Crates of a second TLS stack or crypto provider: TLS is rustls with ring for all
/// three services, so none of these may be anywhere in the workspace's graph (also
/// dev and build dependencies): OpenSSL would need the system library and headers
/// to build, and a second rustls provider makes `ClientConfig::builder()` panic at
/// run time when no process default was installed.
const FORBIDDEN_TLS_CRATES: &[&str] = &[
    "openssl-sys",
    "openssl",
    "native-tls",
    "aws-lc-rs",
    "aws-lc-sys",
];

/// What `cargo tree -i openssl-sys` (and the other [`FORBIDDEN_TLS_CRATES`]) finds
/// in the whole workspace, every kind of dependency and every target platform.
fn tls_problems() -> Result<Vec<String>, String> {
    let mut problems = Vec::new();
    for krate in FORBIDDEN_TLS_CRATES {
        let out = cargo()
            .args([
                "tree",
                "--quiet",
                "--workspace",
                "--target",
                "all",
                "-e",
                "normal,build,dev",
                "--prefix",
                "depth",
                "-i",
                krate,
            ])
            .output()
            .map_err(|e| format!("cargo tree: {e}"))?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        // Absent: cargo tree says the spec matches no package (exit status 101).
        if !out.status.success() && stderr.contains("did not match any packages") {
            continue;
        }
        if !out.status.success() {
            return Err(format!("cargo tree -i {krate} failed: {stderr}"));
        }
        let users: Vec<&str> = stdout
            .lines()
            .filter_map(|l| {
                let name = l.trim_start_matches(|c: char| c.is_ascii_digit());
                (l[..l.len() - name.len()] == *"1").then_some(name)
            })
            .collect();
        if !stdout.trim().is_empty() {
            problems.push(format!(
                "the workspace depends on {krate} (through {}): TLS must be rustls with ring only, no OpenSSL or second provider",
                users.join(", ")
            ));
        }
    }
    Ok(problems)
}

/// The command line's crates (argument parsing, configuration files, anyhow's
/// errors) belong to the binary only.
const CLI_ONLY_CRATES: &[&str] = &["clap", "config", "anyhow"];

/// Crates a library of ours never brings, with all features on: only `outbox-cli`
/// (the binary) and the test, bench and example packages may.
const LIBRARIES_WITHOUT_CLI_CRATES: &[&str] = &[
    "outbox",
    "outbox-core",
    "outbox-ports",
    "outbox-runtime",
    "outbox-relay",
    "outbox-consumer",
    "outbox-admin",
    "outbox-app",
    "outbox-telemetry",
];

/// Drivers and servers the facade without features must not pull.
const DRIVER_CRATES: &[&str] = &[
    "sqlx",
    "lapin",
    "deadpool-redis",
    "redis",
    "tokio-postgres",
    "axum",
    "hyper",
    "clap",
];

/// The layering of the crates: the command line's crates only in `outbox-cli`,
/// the facade without features pulls no driver, and one package has the binary
/// `outbox`.
fn layering_problems() -> Result<Vec<String>, String> {
    let mut problems = Vec::new();
    for lib in LIBRARIES_WITHOUT_CLI_CRATES {
        // What runs in the library, not what a procedural macro of a dependency
        // runs on at build time: prost-derive (under the OTLP exporter) uses anyhow
        // inside the compiler, and nothing of it reaches the library.
        let deps = normal_deps_with(lib, &["--all-features", "-e", "no-proc-macro"])?;
        for bad in deps
            .iter()
            .filter(|d| CLI_ONLY_CRATES.contains(&d.as_str()))
        {
            problems.push(format!(
                "{lib} (all features) depends on {bad}: only outbox-cli may"
            ));
        }
    }
    let bare = normal_deps_with("outbox", &["--no-default-features"])?;
    for bad in bare.iter().filter(|d| DRIVER_CRATES.contains(&d.as_str())) {
        problems.push(format!(
            "outbox with --no-default-features depends on {bad}: the facade without features pulls no driver"
        ));
    }
    let with_bin: Vec<String> = workspace_packages()?
        .into_iter()
        .filter(|p| {
            std::fs::read_to_string(format!("crates/{p}/Cargo.toml"))
                .is_ok_and(|t| declares_bin(&t, "outbox"))
        })
        .collect();
    if with_bin != ["outbox-cli"] {
        problems.push(format!(
            "the binary `outbox` must be outbox-cli's alone; declared by: {with_bin:?}"
        ));
    }
    Ok(problems)
}

/// Whether a manifest declares a `[[bin]]` named `name`.
fn declares_bin(manifest: &str, name: &str) -> bool {
    let wanted = format!("name = \"{name}\"");
    manifest.split("[[bin]]").skip(1).any(|section| {
        section
            .split("\n[")
            .next()
            .is_some_and(|s| s.lines().any(|l| l.trim() == wanted))
    })
}

/// `outbox-app` without default features brings no stack of any feature, and each
/// feature alone brings no other feature's stack: a service built on it pays only
/// for the adapters it chose.
fn app_feature_problems() -> Result<Vec<String>, String> {
    let mut problems = Vec::new();
    // A crate named here that no feature brings (a typo, a rename upstream) would
    // make its check pass vacuously.
    let all = normal_deps_with("outbox-app", &["--all-features"])?;
    for (feature, stack) in APP_FEATURE_STACKS {
        for missing in stack.iter().filter(|c| !all.iter().any(|d| d == *c)) {
            problems.push(format!(
                "xtask's APP_FEATURE_STACKS lists {missing} for feature {feature}, but outbox-app with every feature does not depend on it: fix the list"
            ));
        }
    }
    let selections =
        std::iter::once(None).chain(APP_FEATURE_STACKS.iter().map(|(feature, _)| Some(*feature)));
    for selected in selections {
        let mut args = vec!["--no-default-features"];
        args.extend(selected.iter().flat_map(|f| ["--features", f]));
        let deps = normal_deps_with("outbox-app", &args)?;
        let shown = selected.map_or("no features".to_owned(), |f| format!("feature {f} alone"));
        let implied: &[&str] = APP_FEATURE_IMPLIES
            .iter()
            .find(|(feature, _)| Some(*feature) == selected)
            .map_or(&[], |(_, implied)| implied);
        // What the selection may bring: its own stack and those it turns on.
        let allowed: Vec<&str> = APP_FEATURE_STACKS
            .iter()
            .filter(|(owner, _)| Some(*owner) == selected || implied.contains(owner))
            .flat_map(|(_, stack)| stack.iter().copied())
            .collect();
        for (owner, stack) in APP_FEATURE_STACKS {
            if Some(*owner) == selected || implied.contains(owner) {
                continue;
            }
            for bad in deps
                .iter()
                .filter(|d| stack.contains(&d.as_str()) && !allowed.contains(&d.as_str()))
            {
                problems.push(format!(
                    "outbox-app with {shown} depends on {bad}: only feature {owner} may bring it"
                ));
            }
        }
    }
    Ok(problems)
}

/// ARCHITECTURE.md's code map names only paths that exist. The rule: in the section
/// from the heading `## Code map` to the next `## ` heading, outside fenced blocks,
/// an inline code span is a path when it is made only of letters, digits and
/// `_-./`, does not start with `/`, and contains a `/` or ends in `.rs`, `.toml` or
/// `.md`; it is relative to the repository root (a trailing `/`: a directory).
fn code_map_problems() -> Result<Vec<String>, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .ok_or("xtask has no parent directory")?;
    let doc = std::fs::read_to_string(root.join("ARCHITECTURE.md"))
        .map_err(|e| format!("reading ARCHITECTURE.md: {e}"))?;
    if !doc.lines().any(|l| l.trim_end() == "## Code map") {
        return Ok(vec![
            "ARCHITECTURE.md has no `## Code map` section, whose paths the guard checks".to_owned(),
        ]);
    }
    let mut problems: Vec<String> = missing_code_map_paths(&doc, root)
        .into_iter()
        .map(|p| format!("ARCHITECTURE.md's code map names `{p}`, which does not exist"))
        .collect();
    // The door and the map stay short (details live in docs/ and the modules' docs).
    for (file, max) in [("README.md", 300), ("ARCHITECTURE.md", 350)] {
        let text =
            std::fs::read_to_string(root.join(file)).map_err(|e| format!("reading {file}: {e}"))?;
        if let Some(problem) = too_long(file, &text, max) {
            problems.push(problem);
        }
    }
    Ok(problems)
}

/// `file` (its `text`) over `max` lines, said as a problem.
fn too_long(file: &str, text: &str, max: usize) -> Option<String> {
    let lines = text.lines().count();
    (lines > max)
        .then(|| format!("{file} has {lines} lines; at most {max}, the rest goes to docs/"))
}

/// The paths (see [`code_map_problems`]) of `doc`'s code map missing under `root`.
fn missing_code_map_paths(doc: &str, root: &Path) -> Vec<String> {
    let (mut in_map, mut in_fence, mut map) = (false, false, String::new());
    for line in doc.lines() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
        } else if !in_fence && line.starts_with("## ") {
            in_map = line.trim_end() == "## Code map";
        } else if in_map && !in_fence {
            map.push_str(line);
            map.push('\n');
        }
    }
    let is_path = |t: &str| {
        !t.is_empty()
            && !t.starts_with('/')
            && t.chars()
                .all(|c| c.is_ascii_alphanumeric() || "_-./".contains(c))
            && (t.contains('/') || [".rs", ".toml", ".md"].iter().any(|e| t.ends_with(e)))
    };
    let mut missing: Vec<String> = Vec::new();
    for span in map.split('`').skip(1).step_by(2) {
        if is_path(span) && !root.join(span).exists() && !missing.iter().any(|m| m == span) {
            missing.push(span.to_owned());
        }
    }
    missing
}

#[cfg(test)]
mod tests {
    use super::soak_args_ok;

    fn args(list: &[&str]) -> Result<bool, String> {
        soak_args_ok(&list.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>())
    }

    #[test]
    fn a_bin_is_found_only_in_its_own_section() {
        let cli = "[package]\nname = \"outbox-cli\"\n\n[[bin]]\nname = \"outbox\"\npath = \"src/main.rs\"\n";
        assert!(super::declares_bin(cli, "outbox"));
        let other = "[package]\nname = \"outbox\"\n\n[[bin]]\nname = \"outbox-e2e\"\n";
        assert!(!super::declares_bin(other, "outbox"));
        assert!(!super::declares_bin(
            "[package]\nname = \"outbox\"\n",
            "outbox"
        ));
    }

    #[test]
    fn a_door_over_its_length_is_a_problem() {
        assert_eq!(super::too_long("README.md", "a\nb\n", 2), None);
        assert_eq!(
            super::too_long("README.md", "a\nb\nc\n", 2).as_deref(),
            Some("README.md has 3 lines; at most 2, the rest goes to docs/")
        );
    }

    #[test]
    fn the_code_map_names_only_paths_that_exist() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("xtask is in the workspace");
        let doc = "# Architecture\n\n`crates/gone.rs` before the map is not checked.\n\n\
                   ## Code map\n\n### `xtask/`\n\n`xtask/src/main.rs`, `Cargo.toml`, \
                   `xtask/src/gone.rs` and `docs/gone.md`; not paths: `outbox_core::lease`, \
                   `/api/v1`, `<holder>/<token>`, `a b/c`, `main.rs:12`.\n\
                   ```text\n`in/a/fence.rs`\n```\n\n## Glossary\n\n`crates/gone/` is after it.\n";
        assert_eq!(
            super::missing_code_map_paths(doc, root),
            ["xtask/src/gone.rs", "docs/gone.md"]
        );
    }

    #[test]
    fn soak_arguments_are_checked_before_building() {
        assert_eq!(args(&[]), Ok(true));
        assert_eq!(
            args(&["--duration", "3m", "--rate", "500", "--seed", "1"]),
            Ok(true)
        );
        assert_eq!(args(&["--help"]), Ok(false));
        assert_eq!(args(&["--release", "--duration", "60m"]), Ok(true));
        assert!(args(&["--release", "--release"]).is_err());
        assert!(args(&["--quick"]).is_err());
        assert!(args(&["--rate"]).is_err());
        assert!(args(&["--seed", "1", "--seed", "2"]).is_err());
        assert_eq!(args(&["--generative", "--seed", "3"]), Ok(true));
        assert!(args(&["--generative", "--generative"]).is_err());
    }
}
