//! The `outbox` command; everything is in `outbox_app::cli`.

fn main() -> std::process::ExitCode {
    outbox_app::cli::main()
}
