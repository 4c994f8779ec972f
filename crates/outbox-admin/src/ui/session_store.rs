//! Where the dashboard's sessions live: in the process's memory (bounded, per
//! token too), or in a shared store (tower-sessions' `SessionStore`; PostgreSQL
//! under `outbox run`) so that a restart or a second instance keeps operators
//! signed in.
//!
//! In a shared store a session is keyed by a hash of the cookie's secret, never the
//! secret itself: reading the table opens no session. A session opened with a token
//! is checked against the configured tokens on every read: one whose token was
//! removed, or whose secret changed, ends; its role is the token's role now.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde_json::Value;
use sha2::{Digest as _, Sha256};
use tower_sessions_core::session::{Id, Record};

use super::UiError;
use crate::{Actor, AdminAuth, AdminError, Role};

/// `bytes` random bytes from the operating system, as lowercase hex.
///
/// # Errors
/// When the operating system has no randomness to give.
pub fn random_secret(bytes: usize) -> Result<String, getrandom::Error> {
    let mut buf = vec![0u8; bytes];
    getrandom::fill(&mut buf)?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

pub(crate) fn random_or_fail() -> Result<String, UiError> {
    random_secret(32).map_err(|e| {
        tracing::error!(error = %e, "no randomness for a session id");
        UiError::Render
    })
}

/// How a session was opened: what its reads check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Via {
    /// With an admin token: ends when the token is gone or its secret changed.
    Token,
    /// By the trusted proxy: it names the user again on every request.
    Proxy,
    /// By the one-time login URL.
    Once,
}

impl Via {
    const fn as_str(self) -> &'static str {
        match self {
            Self::Token => "token",
            Self::Proxy => "proxy",
            Self::Once => "once",
        }
    }

    /// What the audit log's actor starts with for a session opened this way.
    const fn actor_prefix(self) -> &'static str {
        match self {
            Self::Token => crate::TOKEN_ACTOR,
            Self::Proxy => crate::SSO_ACTOR,
            Self::Once => crate::ONCE_ACTOR,
        }
    }

    fn parse(s: &str) -> Option<Self> {
        match s {
            "token" => Some(Self::Token),
            "proxy" => Some(Self::Proxy),
            "once" => Some(Self::Once),
            _ => None,
        }
    }
}

/// One logged-in browser (a request extension on every page). `Debug` hides the
/// cookie's secret and the CSRF token.
#[derive(Clone)]
pub(crate) struct Session {
    /// The cookie's secret.
    pub(crate) id: String,
    /// Who acts, named as the audit log names them: the kind's prefix, then
    /// [`user`](Self::user) (`token:ops`, `sso:alice`, `once:demo`), so that no
    /// user can pass for another kind of actor (an SSO user named `cli:root` is
    /// `sso:cli:root`, never the command line's `cli:root`).
    pub(crate) actor: Actor,
    /// The token's, the proxy's user's or the one-time login's own name (what the
    /// page shows).
    pub(crate) user: String,
    pub(crate) csrf: String,
    pub(crate) theme: &'static str,
    /// How it was opened: a proxy's session holds only while the proxy vouches.
    pub(crate) via: Via,
    expires: Instant,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("id", &"***")
            .field("actor", &self.actor)
            .field("user", &self.user)
            .field("csrf", &"***")
            .field("via", &self.via)
            .field("expires", &self.expires)
            .finish_non_exhaustive()
    }
}

impl Session {
    pub(crate) fn can_write(&self) -> bool {
        self.actor.role == Role::Write
    }

    /// Whether this session was opened `via` for `who` (a name as configured or
    /// as the proxy says it, not prefixed) with their role.
    pub(crate) fn is(&self, via: Via, who: &Actor) -> bool {
        self.via == via && self.user == who.name && self.actor.role == who.role
    }

    /// When it ends (a live stream ends then too).
    pub(crate) const fn expires(&self) -> Instant {
        self.expires
    }
}

/// Sessions one token may have open at once in memory; a further login ends its
/// oldest.
pub(crate) const MAX_SESSIONS_PER_TOKEN: usize = 32;

/// The open sessions.
pub(crate) struct SessionStore {
    memory: Mutex<HashMap<String, Session>>,
    ttl: Duration,
    max: usize,
    shared: Option<Arc<dyn tower_sessions_core::SessionStore>>,
    /// Counts the sessions this process ended (a logout, one given way to
    /// another, evicted): a live stream looks its own session up when it moves.
    ended: tokio::sync::watch::Sender<u64>,
}

/// A shared store that does not answer: the page says so (503), it does not
/// send the operator to a login that could not open a session either.
/// The page says only that; the cause goes to the log (it may name the
/// database, and anyone can make a session be read by sending a cookie).
fn unavailable(e: &tower_sessions_core::session_store::Error) -> UiError {
    tracing::warn!(error = %e, "dashboard sessions cannot be read or written");
    UiError::Admin(AdminError::Port(outbox_ports::PortError::transient(
        "dashboard sessions",
        "the session store does not answer; try again shortly",
    )))
}

/// The key a session is stored under: a hash of the cookie's secret.
fn stored_id(secret: &str) -> Id {
    let digest = Sha256::digest(secret.as_bytes());
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    Id(i128::from_le_bytes(bytes))
}

/// The cookie's secret of proxy user `user`'s one session: a hash of the proxy's
/// secret and the name (unguessable without the secret; the same on every
/// instance).
fn proxy_session_id(proxy_secret: &crate::Secret, user: &str) -> String {
    let mut hash = Sha256::new();
    hash.update(b"outbox dashboard sso session\0");
    hash.update(proxy_secret.expose().as_bytes());
    hash.update([0]);
    hash.update(user.as_bytes());
    hash.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// What identifies a token's secret without being it, to tell whether a stored
/// session's token is still the one configured: salted per session, so a read of
/// the table cannot test guesses of a short secret against every row at once.
fn fingerprint(salt: &str, secret: &str) -> String {
    let mut hash = Sha256::new();
    hash.update(salt.as_bytes());
    hash.update([0]);
    hash.update(secret.as_bytes());
    hash.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

fn role_name(role: Role) -> &'static str {
    match role {
        Role::Read => "read",
        Role::Write => "write",
    }
}

impl SessionStore {
    pub(crate) fn new(
        ttl: Duration,
        max: usize,
        shared: Option<Arc<dyn tower_sessions_core::SessionStore>>,
    ) -> Self {
        Self {
            memory: Mutex::default(),
            ttl,
            max: max.max(1),
            shared,
            ended: tokio::sync::watch::channel(0).0,
        }
    }

    /// Moves whenever this process ends a session: a live stream then looks
    /// whether its own is still there.
    pub(crate) fn ended(&self) -> tokio::sync::watch::Receiver<u64> {
        self.ended.subscribe()
    }

    fn count_ended(&self) {
        self.ended.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Opens a session for `who` (named as configured or as the proxy says it;
    /// the session's actor gets `via`'s prefix).
    pub(crate) async fn create(
        &self,
        who: Actor,
        via: Via,
        auth: &AdminAuth,
    ) -> Result<Session, UiError> {
        self.create_as(random_or_fail()?, who, via, auth).await
    }

    /// The one session of `who`, signed in by the trusted proxy whose secret is
    /// `proxy_secret`: reused while it lives (every page load without a cookie,
    /// in any browser, finds it), opened again when it ended or the user's role
    /// changed. So the proxy's users hold one stored session each, however many
    /// pages they load. Its cookie's secret is derived from the proxy's secret and
    /// the user's name (the same on every instance sharing a store); it opens
    /// nothing without the proxy, which vouches for it on every request.
    pub(crate) async fn for_proxy_user(
        &self,
        who: Actor,
        proxy_secret: &crate::Secret,
        auth: &AdminAuth,
    ) -> Result<Session, UiError> {
        let id = proxy_session_id(proxy_secret, &who.name);
        if let Some(session) = self.get(&id, auth).await?
            && session.is(Via::Proxy, &who)
        {
            return Ok(session);
        }
        self.create_as(id, who, Via::Proxy, auth).await
    }

    async fn create_as(
        &self,
        id: String,
        who: Actor,
        via: Via,
        auth: &AdminAuth,
    ) -> Result<Session, UiError> {
        let session = Session {
            id,
            actor: Actor {
                name: format!("{}{}", via.actor_prefix(), who.name),
                role: who.role,
            },
            user: who.name,
            csrf: random_or_fail()?,
            theme: "auto",
            via,
            expires: Instant::now() + self.ttl,
        };
        let Some(shared) = &self.shared else {
            self.keep_in_memory(&session);
            return Ok(session);
        };
        let mut data = HashMap::from([
            ("actor".to_owned(), Value::from(session.user.clone())),
            (
                "role".to_owned(),
                Value::from(role_name(session.actor.role)),
            ),
            ("csrf".to_owned(), Value::from(session.csrf.clone())),
            ("via".to_owned(), Value::from(via.as_str())),
        ]);
        if via == Via::Token
            && let Some(token) = auth.token_named(&session.user)
        {
            let salt = random_or_fail()?;
            data.insert(
                "token".to_owned(),
                Value::from(fingerprint(&salt, token.secret.expose())),
            );
            data.insert("token_salt".to_owned(), Value::from(salt));
        }
        let ttl = time::Duration::try_from(self.ttl).unwrap_or(time::Duration::MAX);
        let record = Record {
            id: stored_id(&session.id),
            data,
            expiry_date: time::OffsetDateTime::now_utc().saturating_add(ttl),
        };
        shared.save(&record).await.map_err(|e| unavailable(&e))?;
        Ok(session)
    }

    fn keep_in_memory(&self, session: &Session) {
        let now = Instant::now();
        let mut sessions = self.memory.lock().unwrap_or_else(PoisonError::into_inner);
        let before = sessions.len();
        sessions.retain(|id, s| s.expires > now && *id != session.id);
        // Each token's own sessions first: one token logging in over and over only
        // ever evicts its own oldest sessions, never another operator's.
        loop {
            let mut own: Vec<(&String, Instant)> = sessions
                .iter()
                .filter(|(_, s)| s.actor.name == session.actor.name)
                .map(|(id, s)| (id, s.expires))
                .collect();
            if own.len() < MAX_SESSIONS_PER_TOKEN {
                break;
            }
            own.sort_by_key(|(_, expires)| *expires);
            let oldest = own[0].0.clone();
            sessions.remove(&oldest);
        }
        while sessions.len() >= self.max {
            let Some(oldest) = sessions
                .iter()
                .min_by_key(|(_, s)| s.expires)
                .map(|(id, _)| id.clone())
            else {
                break;
            };
            sessions.remove(&oldest);
        }
        let evicted = sessions.len() < before;
        sessions.insert(session.id.clone(), session.clone());
        drop(sessions);
        if evicted {
            self.count_ended();
        }
    }

    /// The session the cookie's secret `id` opens, if it is alive.
    pub(crate) async fn get(&self, id: &str, auth: &AdminAuth) -> Result<Option<Session>, UiError> {
        let Some(shared) = &self.shared else {
            let mut sessions = self.memory.lock().unwrap_or_else(PoisonError::into_inner);
            return Ok(match sessions.get(id) {
                Some(s) if s.expires > Instant::now() => Some(s.clone()),
                Some(_) => {
                    sessions.remove(id);
                    None
                }
                None => None,
            });
        };
        let key = stored_id(id);
        let Some(record) = shared.load(&key).await.map_err(|e| unavailable(&e))? else {
            return Ok(None);
        };
        let now = time::OffsetDateTime::now_utc();
        let text = |k: &str| record.data.get(k).and_then(Value::as_str);
        let (Some(name), Some(role), Some(csrf), Some(via)) = (
            text("actor"),
            text("role"),
            text("csrf"),
            text("via").and_then(Via::parse),
        ) else {
            return Ok(None);
        };
        let role = match (via, role) {
            // The token as configured now: gone or with another secret, the
            // session ends; its role is the token's role now.
            (Via::Token, _) => match (auth.token_named(name), text("token_salt")) {
                (Some(token), Some(salt))
                    if text("token") == Some(fingerprint(salt, token.secret.expose()).as_str()) =>
                {
                    token.role
                }
                _ => {
                    let _ = shared.delete(&key).await;
                    self.count_ended();
                    return Ok(None);
                }
            },
            (_, "write") => Role::Write,
            (_, "read") => Role::Read,
            _ => return Ok(None),
        };
        if record.expiry_date <= now {
            return Ok(None);
        }
        let left = Duration::try_from(record.expiry_date - now).unwrap_or_default();
        Ok(Some(Session {
            id: id.to_owned(),
            actor: Actor {
                name: format!("{}{name}", via.actor_prefix()),
                role,
            },
            user: name.to_owned(),
            csrf: csrf.to_owned(),
            theme: "auto",
            via,
            expires: Instant::now() + left,
        }))
    }

    /// Ends the session of the cookie's secret `id`.
    pub(crate) async fn remove(&self, id: &str) {
        match &self.shared {
            Some(shared) => {
                if let Err(e) = shared.delete(&stored_id(id)).await {
                    tracing::warn!(error = %e, "a dashboard session could not be deleted; it ends at its expiry");
                }
            }
            None => {
                self.memory
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(id);
            }
        }
        self.count_ended();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_tokens() -> AdminAuth {
        AdminAuth::default()
    }

    #[tokio::test]
    async fn sessions_expire_and_the_store_stays_bounded() {
        let auth = no_tokens();
        let store = SessionStore::new(Duration::from_secs(60), 2, None);
        let actor = Actor {
            name: "ops".into(),
            role: Role::Write,
        };
        let a = store
            .create(actor.clone(), Via::Once, &auth)
            .await
            .expect("session");
        let b = store
            .create(actor.clone(), Via::Once, &auth)
            .await
            .expect("session");
        assert_ne!(a.id, b.id);
        assert_ne!(a.csrf, b.csrf);
        assert_eq!(a.id.len(), 64);
        let c = store
            .create(actor.clone(), Via::Once, &auth)
            .await
            .expect("session");
        let mut alive = 0;
        for s in [&a, &b, &c] {
            if store.get(&s.id, &auth).await.expect("read").is_some() {
                alive += 1;
            }
        }
        assert_eq!(alive, 2, "at most two sessions are kept");
        assert!(
            store.get(&c.id, &auth).await.expect("read").is_some(),
            "the newest survives"
        );
        store.remove(&c.id).await;
        assert!(store.get(&c.id, &auth).await.expect("read").is_none());

        let expired = SessionStore::new(Duration::ZERO, 10, None);
        let s = expired
            .create(actor, Via::Once, &auth)
            .await
            .expect("session");
        assert!(
            expired.get(&s.id, &auth).await.expect("read").is_none(),
            "a session past its ttl is gone"
        );
    }

    #[tokio::test]
    async fn one_token_logging_in_again_and_again_never_evicts_another() {
        let auth = no_tokens();
        let store = SessionStore::new(Duration::from_secs(60), 100, None);
        let actor = |name: &str| Actor {
            name: name.into(),
            role: Role::Read,
        };
        let alice = store
            .create(actor("alice"), Via::Once, &auth)
            .await
            .expect("session");
        for _ in 0..200 {
            store
                .create(actor("script"), Via::Once, &auth)
                .await
                .expect("session");
        }
        assert!(
            store.get(&alice.id, &auth).await.expect("read").is_some(),
            "another token's session is kept"
        );
        let scripts = store
            .memory
            .lock()
            .expect("lock")
            .values()
            .filter(|s| s.user == "script")
            .count();
        assert_eq!(scripts, MAX_SESSIONS_PER_TOKEN);
    }

    #[tokio::test]
    async fn a_proxy_user_keeps_one_session_in_memory_and_actors_name_their_kind() {
        let auth = no_tokens();
        let store = SessionStore::new(Duration::from_secs(60), 100, None);
        let secret = crate::Secret::new("proxy-secret-0123456789");
        let who = |name: &str, role| Actor {
            name: name.into(),
            role,
        };
        let first = store
            .for_proxy_user(who("cli:root", Role::Write), &secret, &auth)
            .await
            .expect("session");
        assert_eq!(first.actor.name, "sso:cli:root");
        assert_eq!(first.user, "cli:root");
        for _ in 0..100 {
            let again = store
                .for_proxy_user(who("cli:root", Role::Write), &secret, &auth)
                .await
                .expect("session");
            assert_eq!((&again.id, &again.csrf), (&first.id, &first.csrf));
        }
        assert_eq!(store.memory.lock().expect("lock").len(), 1);
        // Another role (the user's groups changed): opened again, still one.
        let read = store
            .for_proxy_user(who("cli:root", Role::Read), &secret, &auth)
            .await
            .expect("session");
        assert_ne!(read.csrf, first.csrf);
        assert_eq!(store.memory.lock().expect("lock").len(), 1);
        // Another proxy secret: another id (a session is the proxy's).
        let other = store
            .for_proxy_user(
                who("cli:root", Role::Read),
                &crate::Secret::new("another-proxy-secret-0123"),
                &auth,
            )
            .await
            .expect("session");
        assert_ne!(other.id, read.id);
        let once = store
            .create(who("demo", Role::Write), Via::Once, &auth)
            .await
            .expect("session");
        assert_eq!(once.actor.name, "once:demo");
        let shown = format!("{once:?}");
        assert!(
            !shown.contains(&once.id) && !shown.contains(&once.csrf),
            "{shown}"
        );
    }

    #[test]
    fn the_stored_key_is_not_the_cookie_and_differs_per_secret() {
        let a = stored_id("aaaa");
        assert_eq!(a, stored_id("aaaa"));
        assert_ne!(a, stored_id("aaab"));
        assert_ne!(a.to_string(), "aaaa");
    }
}
