//! The `outbox` command; everything is in `outbox_cli::cli`.

fn main() -> std::process::ExitCode {
    outbox_cli::cli::main()
}
