//! `sqlx::migrate!` embeds `migrations/` at compile time, but cargo does not know the
//! crate depends on that directory: without this, a migration added later is left out
//! of an incremental build (the schema silently misses it).
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
