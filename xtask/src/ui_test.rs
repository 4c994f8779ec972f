//! `cargo xtask ui-test [--docs DIR]`: the dashboard's browser tests
//! (`outbox-ui-browser`): headless Debian `chromium` driven through
//! `chromedriver`, against the dashboard over the in-memory adapters. Fails, with
//! the install command, when either is missing (never a silent skip); on a failed
//! scenario a screenshot is kept under `<target>/ui-screenshots/`. With `--docs`,
//! takes the screenshots of `docs/admin.md` into DIR instead. `ci` runs it after the tests.

use std::path::Path;
use std::process::Command;

use crate::run;

pub(crate) fn ui_test(args: &[String]) -> Result<(), String> {
    let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".to_owned());
    let chromedriver =
        std::env::var("CHROMEDRIVER").unwrap_or_else(|_| "/usr/bin/chromedriver".to_owned());
    for (what, path) in [("chromium", &chromium), ("chromedriver", &chromedriver)] {
        if !Path::new(path).exists() {
            return Err(format!(
                "ui-test needs Debian's chromium and chromium-driver, and {what} is not at {path}: `apt-get install -y chromium chromium-driver` (.ci/run installs them), or set CHROMIUM / CHROMEDRIVER"
            ));
        }
    }
    run(
        "build",
        crate::cargo().args(["build", "-p", "outbox-ui-browser"]),
    )?;
    let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".to_owned());
    let mut cmd = Command::new(format!("{target}/debug/outbox-ui-browser"));
    cmd.args(args)
        .env("CHROMIUM", &chromium)
        .env("CHROMEDRIVER", &chromedriver)
        .env("UI_SCREENSHOTS", format!("{target}/ui-screenshots"));
    run("ui-test", &mut cmd)
}
