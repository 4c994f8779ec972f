//! The `outbox` command, built inside this package so its tests can run the real
//! binary (`CARGO_BIN_EXE_outbox-e2e-relay`).

fn main() -> std::process::ExitCode {
    outbox_cli::cli::main()
}
