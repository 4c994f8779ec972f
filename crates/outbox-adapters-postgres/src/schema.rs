//! The schema that holds the tables, and the migrations that create them.

use std::fmt;

use sqlx::PgPool;

use crate::PgConfigError;

/// Longest schema name accepted: the wake-up channel `outbox_wakeup.<schema>` must fit
/// PostgreSQL's 63-byte identifier limit.
pub const MAX_SCHEMA_LEN: usize = 48;

/// A schema name that is a plain identifier: lowercase ASCII letters, digits and
/// underscores, starting with a letter or underscore, at most [`MAX_SCHEMA_LEN`]
/// bytes, and not a `pg_` system name. Only such names are ever put into SQL, and
/// always quoted.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct PgSchema(String);

impl PgSchema {
    /// Validates `name`.
    ///
    /// # Errors
    /// [`PgConfigError::InvalidSchema`] saying what is wrong.
    pub fn new(name: &str) -> Result<Self, PgConfigError> {
        let invalid = |reason| {
            Err(PgConfigError::InvalidSchema {
                name: name.to_owned(),
                reason,
            })
        };
        let mut chars = name.chars();
        match chars.next() {
            None => return invalid("must not be empty"),
            Some(c) if !(c.is_ascii_lowercase() || c == '_') => {
                return invalid("must start with a lowercase letter or an underscore");
            }
            Some(_) => {}
        }
        if !chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_') {
            return invalid("may hold only lowercase letters, digits and underscores");
        }
        if name.len() > MAX_SCHEMA_LEN {
            return invalid("is longer than 48 characters");
        }
        if name.starts_with("pg_") || name == "information_schema" {
            return invalid("is reserved by PostgreSQL");
        }
        Ok(Self(name.to_owned()))
    }

    /// The name.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The quoted identifier, for building SQL.
    #[must_use]
    pub fn quoted(&self) -> String {
        format!("\"{}\"", self.0)
    }

    /// The notification channel relays of this schema listen on.
    #[must_use]
    pub fn wakeup_channel(&self) -> String {
        format!("outbox_wakeup.{}", self.0)
    }
}

impl Default for PgSchema {
    fn default() -> Self {
        Self("outbox".to_owned())
    }
}

impl fmt::Debug for PgSchema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PgSchema({})", self.0)
    }
}

impl fmt::Display for PgSchema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The embedded migrations.
static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// Creates `schema` if needed and brings its tables up to date. Idempotent and safe
/// to run from several instances at once (sqlx takes an advisory lock).
///
/// # Errors
/// [`PgConfigError::Migration`] naming the schema and the cause.
pub async fn migrate(pool: &PgPool, schema: &PgSchema) -> Result<(), PgConfigError> {
    let fail = |e: &dyn fmt::Display| PgConfigError::Migration {
        schema: schema.to_string(),
        reason: e.to_string(),
    };
    let mut conn = pool.acquire().await.map_err(|e| fail(&e))?;
    // Quiet: the NOTICEs of `IF EXISTS` / `IF NOT EXISTS` ("... already exists,
    // skipping") say nothing an operator running `outbox migrate` twice needs to
    // read; warnings and errors still come through. Reset below.
    sqlx::query("SELECT set_config('client_min_messages', 'warning', false)")
        .execute(&mut *conn)
        .await
        .map_err(|e| fail(&e))?;
    // The name is validated and quoted; DDL cannot take it as a bind parameter.
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE SCHEMA IF NOT EXISTS {}",
        schema.quoted()
    )))
    .execute(&mut *conn)
    .await
    .map_err(|e| fail(&e))?;
    sqlx::query("SELECT set_config('search_path', $1, false)")
        .bind(schema.quoted())
        .execute(&mut *conn)
        .await
        .map_err(|e| fail(&e))?;
    // Migrations are exempt from the pool's statement and lock bounds
    // (`SessionBounds`): an index build on a big table may rightly take longer, and
    // a migration given up half way would be run again from its start. Migrations
    // that must not queue behind other sessions set their own `lock_timeout`.
    sqlx::query("SELECT set_config('statement_timeout', '0', false), set_config('lock_timeout', '0', false)")
        .execute(&mut *conn)
        .await
        .map_err(|e| fail(&e))?;
    let result = MIGRATOR.run(&mut *conn).await.map_err(|e| fail(&e));
    if result.is_err() {
        // sqlx's migrator takes a session-wide advisory lock (one per database) and
        // releases it only on success: this session must end, or its lock would go
        // back into the pool and block every later migration in the database.
        let _ = sqlx::Connection::close(conn.detach()).await;
        return result;
    }
    // The connection goes back to the pool: give it its default search_path again.
    // And its own bounds: RESET returns to the values the session started with.
    let _ = sqlx::raw_sql(
        "RESET search_path; RESET statement_timeout; RESET lock_timeout; RESET client_min_messages",
    )
    .execute(&mut *conn)
    .await;
    result
}

/// Checks that `schema` has every migration this build embeds: new code on an
/// older schema would fail its statements (a failure mark writing a column the
/// schema lacks would leave the row leased and published again, never dead).
///
/// # Errors
/// [`PgConfigError::SchemaBehind`] naming what the schema has and what is needed;
/// [`PgConfigError::Migration`] when the check itself cannot read.
pub async fn check_current(pool: &PgPool, schema: &PgSchema) -> Result<(), PgConfigError> {
    let needed = MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0);
    let read = sqlx::query_scalar::<_, Option<i64>>(sqlx::AssertSqlSafe(format!(
        "SELECT max(version) FROM {}._sqlx_migrations WHERE success",
        schema.quoted()
    )))
    .fetch_one(pool)
    .await;
    let found = match read {
        Ok(Some(v)) if v >= needed => return Ok(()),
        Ok(Some(v)) => format!("at migration {v}"),
        Ok(None) => "without the outbox's tables".to_owned(),
        // 42P01: no migrations table (never migrated); 3F000: no such schema.
        Err(sqlx::Error::Database(db))
            if matches!(db.code().as_deref(), Some("42P01" | "3F000")) =>
        {
            "without the outbox's tables".to_owned()
        }
        Err(e) => {
            return Err(PgConfigError::Migration {
                schema: schema.to_string(),
                reason: format!("cannot read its migrations: {e}"),
            });
        }
    };
    Err(PgConfigError::SchemaBehind {
        schema: schema.to_string(),
        found,
        needed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_identifiers_are_schemas() {
        for good in ["outbox", "_x", "orders_outbox_2", &"a".repeat(48)] {
            assert!(PgSchema::new(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "Outbox",
            "1abc",
            "out box",
            "x\"; DROP TABLE users; --",
            "a.b",
            "pg_catalog",
            "information_schema",
            "é",
            &"a".repeat(49),
        ] {
            let e = PgSchema::new(bad).expect_err(bad);
            assert!(e.to_string().starts_with("invalid schema name"), "{e}");
        }
        assert_eq!(PgSchema::default().quoted(), "\"outbox\"");
    }
}
