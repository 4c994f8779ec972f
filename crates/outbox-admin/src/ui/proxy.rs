//! Sign-in by a trusted proxy: single sign-on in front of the dashboard
//! (oauth2-proxy, an ingress's auth, and the like) names the signed-in user, and
//! its groups, in request headers. Those headers are believed only on requests
//! whose peer address is one of the proxy's (`from`) and that carry the secret
//! shared with the proxy in its header (compared in constant time, never logged):
//! from anywhere else, or without the secret (any local process when `from` is
//! loopback), anyone could send them, so they are ignored there and the login form
//! applies. A user gets a role by name or through a group; one with neither is
//! refused, not let in read-only.

use std::collections::BTreeMap;
use std::net::IpAddr;

use axum::http::HeaderMap;
use subtle::ConstantTimeEq;

use crate::auth::{Actor, Role, Secret};

/// The longest user or group name taken from a header.
const MAX_NAME_CHARS: usize = 255;

/// The longest groups header taken (users of identity providers are often in
/// many groups); each group in it is a name of at most [`MAX_NAME_CHARS`].
const MAX_GROUPS_CHARS: usize = 8 * 1024;

/// Who may sign in through a proxy, and as what.
#[derive(Debug, Clone)]
pub struct TrustedProxy {
    /// The header naming the signed-in user (`X-Forwarded-User`).
    pub user_header: String,
    /// The header listing the user's groups, comma-separated
    /// (`X-Forwarded-Groups`); `None`: roles by user name only.
    pub groups_header: Option<String>,
    /// The proxy's addresses: only requests from these are believed.
    pub from: Vec<ipnet::IpNet>,
    /// Roles by user name.
    pub users: BTreeMap<String, Role>,
    /// Roles by group name (a user in several gets the strongest).
    pub groups: BTreeMap<String, Role>,
    /// The header the proxy sends [`secret`](Self::secret) in
    /// (`X-Outbox-Proxy-Secret`), on every request.
    pub secret_header: String,
    /// The secret shared with the proxy: a request without it (exactly once, in
    /// `secret_header`) is not the proxy's, whatever its peer address. `Debug`
    /// hides it.
    pub secret: Secret,
}

/// What the proxy says of a request.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Proxied {
    /// Not through the proxy (another peer, no header, no peer known): the
    /// dashboard's own sign-in applies.
    No,
    /// Signed in at the proxy as this actor.
    As(Actor),
    /// Signed in at the proxy as this user, who has no role here.
    NoRole(String),
}

pub(crate) use crate::client::{forwarded_for, in_nets};

impl TrustedProxy {
    /// Whether a request from `peer` with `headers` is the proxy's: `peer` is one
    /// of its addresses and the shared secret came, once, in its header.
    pub(crate) fn vouches(&self, peer: Option<IpAddr>, headers: &HeaderMap) -> bool {
        if !peer.is_some_and(|p| in_nets(&self.from, p)) {
            return false;
        }
        let mut sent = headers.get_all(self.secret_header.as_str()).iter();
        let (Some(value), None) = (sent.next(), sent.next()) else {
            return false;
        };
        let secret = self.secret.expose().as_bytes();
        !secret.is_empty() && bool::from(value.as_bytes().ct_eq(secret))
    }

    /// Who `headers` say signed in, when `peer` is the proxy.
    pub(crate) fn identify(&self, peer: Option<IpAddr>, headers: &HeaderMap) -> Proxied {
        if !self.vouches(peer, headers) {
            return Proxied::No;
        }
        let Some(user) = header_text(headers, &self.user_header, MAX_NAME_CHARS) else {
            return Proxied::No;
        };
        // Sent twice, a header is not the proxy's word alone: a proxy that appends
        // its value after the client's would otherwise be read as the client's.
        if self
            .groups_header
            .as_deref()
            .is_some_and(|h| headers.get_all(h).iter().count() > 1)
        {
            return Proxied::No;
        }
        let by_group = self
            .groups_header
            .as_deref()
            .and_then(|h| header_text(headers, h, MAX_GROUPS_CHARS))
            .into_iter()
            .flat_map(|list| {
                list.split(',')
                    .map(|g| g.trim().to_owned())
                    .filter(|g| g.chars().count() <= MAX_NAME_CHARS)
                    .collect::<Vec<_>>()
            })
            .filter_map(|g| self.groups.get(&g).copied());
        let role = self
            .users
            .get(&user)
            .copied()
            .into_iter()
            .chain(by_group)
            .max_by_key(|r| match r {
                Role::Read => 0,
                Role::Write => 1,
            });
        match role {
            Some(role) => Proxied::As(Actor { name: user, role }),
            None => Proxied::NoRole(user),
        }
    }
}

/// A header's one value as text: trimmed, not empty, at most `max` characters,
/// without control characters; `None` otherwise, and when the header came more
/// than once (a malformed or doubled header is no sign-in).
fn header_text(headers: &HeaderMap, name: &str, max: usize) -> Option<String> {
    let mut values = headers.get_all(name).iter();
    let value = values.next()?;
    if values.next().is_some() {
        return None;
    }
    let value = value.to_str().ok()?.trim();
    (!value.is_empty() && value.chars().count() <= max && !value.chars().any(char::is_control))
        .then(|| value.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proxy() -> TrustedProxy {
        TrustedProxy {
            user_header: "x-forwarded-user".into(),
            groups_header: Some("x-forwarded-groups".into()),
            from: vec!["10.0.0.0/8".parse().unwrap_or_else(|_| unreachable!())],
            users: BTreeMap::from([
                ("alice".to_owned(), Role::Write),
                ("bob".to_owned(), Role::Read),
            ]),
            groups: BTreeMap::from([
                ("ops".to_owned(), Role::Write),
                ("dev".to_owned(), Role::Read),
            ]),
            secret_header: "x-outbox-proxy-secret".into(),
            secret: Secret::new(SECRET),
        }
    }

    const SECRET: &str = "proxy-secret-0123456789";

    /// `pairs` with the proxy's secret.
    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = without_secret(pairs);
        h.insert(
            "x-outbox-proxy-secret",
            SECRET.parse().unwrap_or_else(|_| unreachable!()),
        );
        h
    }

    fn without_secret(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap_or_else(|_| unreachable!()));
        }
        h
    }

    #[test]
    fn without_the_shared_secret_the_headers_are_anyones() {
        let p = proxy();
        let alice = [("x-forwarded-user", "alice")];
        assert!(matches!(
            p.identify(at("10.1.2.3"), &headers(&alice)),
            Proxied::As(_)
        ));
        assert_eq!(
            p.identify(at("10.1.2.3"), &without_secret(&alice)),
            Proxied::No,
            "no secret"
        );
        let mut wrong = without_secret(&alice);
        wrong.insert(
            "x-outbox-proxy-secret",
            "proxy-secret-0123456788"
                .parse()
                .unwrap_or_else(|_| unreachable!()),
        );
        assert_eq!(
            p.identify(at("10.1.2.3"), &wrong),
            Proxied::No,
            "a wrong one"
        );
        let mut twice = headers(&alice);
        twice.append(
            "x-outbox-proxy-secret",
            SECRET.parse().unwrap_or_else(|_| unreachable!()),
        );
        assert_eq!(
            p.identify(at("10.1.2.3"), &twice),
            Proxied::No,
            "sent twice"
        );
        assert!(!format!("{p:?}").contains(SECRET), "Debug hides it");
    }

    fn at(ip: &str) -> Option<IpAddr> {
        ip.parse().ok()
    }

    #[test]
    fn only_the_proxys_addresses_are_believed() {
        let p = proxy();
        let alice = headers(&[("x-forwarded-user", "alice")]);
        assert_eq!(
            p.identify(at("10.1.2.3"), &alice),
            Proxied::As(Actor {
                name: "alice".into(),
                role: Role::Write
            })
        );
        assert_eq!(
            p.identify(at("192.168.1.1"), &alice),
            Proxied::No,
            "another peer"
        );
        assert_eq!(p.identify(None, &alice), Proxied::No, "no peer known");
        assert_eq!(
            p.identify(at("::ffff:10.1.2.3"), &alice),
            Proxied::As(Actor {
                name: "alice".into(),
                role: Role::Write
            }),
            "an IPv4-mapped peer is its IPv4 address"
        );
        assert_eq!(p.identify(at("10.1.2.3"), &HeaderMap::new()), Proxied::No);
    }

    #[test]
    fn roles_come_by_name_or_the_strongest_group_and_none_is_no_role() {
        let p = proxy();
        let read = p.identify(at("10.0.0.1"), &headers(&[("x-forwarded-user", "bob")]));
        assert!(matches!(
            read,
            Proxied::As(Actor {
                role: Role::Read,
                ..
            })
        ));
        let promoted = p.identify(
            at("10.0.0.1"),
            &headers(&[
                ("x-forwarded-user", "bob"),
                ("x-forwarded-groups", "dev, ops"),
            ]),
        );
        assert!(matches!(
            promoted,
            Proxied::As(Actor {
                role: Role::Write,
                ..
            })
        ));
        let carol = p.identify(
            at("10.0.0.1"),
            &headers(&[
                ("x-forwarded-user", "carol"),
                ("x-forwarded-groups", "sales"),
            ]),
        );
        assert_eq!(carol, Proxied::NoRole("carol".into()));
        let blank = p.identify(at("10.0.0.1"), &headers(&[("x-forwarded-user", "  ")]));
        assert_eq!(blank, Proxied::No, "an empty user is no sign-in");
    }

    #[test]
    fn a_doubled_header_is_no_sign_in() {
        let p = proxy();
        let mut twice = headers(&[("x-forwarded-user", "bob")]);
        twice.append(
            "x-forwarded-user",
            "alice".parse().unwrap_or_else(|_| unreachable!()),
        );
        assert_eq!(p.identify(at("10.0.0.1"), &twice), Proxied::No);
        let mut groups = headers(&[("x-forwarded-user", "bob"), ("x-forwarded-groups", "ops")]);
        groups.append(
            "x-forwarded-groups",
            "dev".parse().unwrap_or_else(|_| unreachable!()),
        );
        assert_eq!(p.identify(at("10.0.0.1"), &groups), Proxied::No);
        // Many groups fit; the one that gives a role is found among them.
        let many: String = (0..300).map(|i| format!("g{i},")).collect::<String>() + "ops";
        let mut long = headers(&[("x-forwarded-user", "bob")]);
        long.insert(
            "x-forwarded-groups",
            many.parse().unwrap_or_else(|_| unreachable!()),
        );
        assert!(matches!(
            p.identify(at("10.0.0.1"), &long),
            Proxied::As(Actor {
                role: Role::Write,
                ..
            })
        ));
    }
}
