//! Sign-in by a trusted proxy: single sign-on in front of the dashboard
//! (oauth2-proxy, an ingress's auth, and the like) names the signed-in user, and
//! its groups, in request headers. Those headers are believed only on requests
//! whose peer address is one of the proxy's (`from`): from anywhere else anyone
//! could send them, so they are ignored there and the login form applies. A user
//! gets a role by name or through a group; one with neither is refused, not let
//! in read-only.

use std::collections::BTreeMap;
use std::net::IpAddr;

use axum::http::HeaderMap;

use crate::auth::{Actor, Role};

/// The longest user or group name taken from a header.
const MAX_NAME_CHARS: usize = 255;

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

impl TrustedProxy {
    /// Whether `peer` is one of the proxy's addresses.
    fn trusts(&self, peer: IpAddr) -> bool {
        // An IPv4 peer may arrive as an IPv4-mapped IPv6 address on a dual-stack
        // socket: compared as the IPv4 address it is.
        let peer = match peer {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(peer, IpAddr::V4),
            v4 => v4,
        };
        self.from.iter().any(|net| net.contains(&peer))
    }

    /// Who `headers` say signed in, when `peer` is the proxy.
    pub(crate) fn identify(&self, peer: Option<IpAddr>, headers: &HeaderMap) -> Proxied {
        if !peer.is_some_and(|p| self.trusts(p)) {
            return Proxied::No;
        }
        let Some(user) = header_text(headers, &self.user_header) else {
            return Proxied::No;
        };
        let by_group = self
            .groups_header
            .as_deref()
            .and_then(|h| header_text(headers, h))
            .into_iter()
            .flat_map(|list| {
                list.split(',')
                    .map(|g| g.trim().to_owned())
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

/// A header's value as a name: text, trimmed, not empty, not too long, without
/// control characters; `None` otherwise (a malformed header is no sign-in).
fn header_text(headers: &HeaderMap, name: &str) -> Option<String> {
    let value = headers.get(name)?.to_str().ok()?.trim();
    (!value.is_empty()
        && value.chars().count() <= MAX_NAME_CHARS
        && !value.chars().any(char::is_control))
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
        }
    }

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap_or_else(|_| unreachable!()));
        }
        h
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
}
