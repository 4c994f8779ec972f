//! The client a request came from, as the failed-attempt limits count it: the TCP
//! peer, or when the peer is a declared forwarder (a TLS terminator, a load
//! balancer) the address it says it forwarded for.

use std::net::IpAddr;

use axum::http::{Extensions, HeaderMap};

/// Whether `peer` is in one of `nets`. An IPv4 peer may arrive as an IPv4-mapped
/// IPv6 address on a dual-stack socket: compared as the IPv4 address it is.
pub(crate) fn in_nets(nets: &[ipnet::IpNet], peer: IpAddr) -> bool {
    let peer = match peer {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(peer, IpAddr::V4),
        v4 => v4,
    };
    nets.iter().any(|net| net.contains(&peer))
}

/// The client a forwarding proxy says it forwarded for: the last address of its
/// `X-Forwarded-For` (the one the proxy itself appended).
pub(crate) fn forwarded_for(headers: &HeaderMap) -> Option<IpAddr> {
    headers
        .get_all("x-forwarded-for")
        .iter()
        .next_back()
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.rsplit(',').next())
        .and_then(|v| v.trim().parse().ok())
}

/// The TCP peer as the server saw it (`into_make_service_with_connect_info`), or
/// as a test's `MockConnectInfo` layer sets it; `None` when the server keeps no
/// connect info.
pub(crate) fn peer_of(extensions: &Extensions) -> Option<IpAddr> {
    extensions
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0.ip())
        .or_else(|| {
            extensions
                .get::<axum::extract::connect_info::MockConnectInfo<std::net::SocketAddr>>()
                .map(|c| c.0.ip())
        })
}

/// The client of a request from `peer` with `headers`: the address a forwarder
/// (one of `forwarders`) forwarded for, else the peer.
pub(crate) fn client_of(
    peer: Option<IpAddr>,
    headers: &HeaderMap,
    forwarders: &[ipnet::IpNet],
) -> Option<IpAddr> {
    if peer.is_some_and(|p| in_nets(forwarders, p)) {
        forwarded_for(headers).or(peer)
    } else {
        peer
    }
}
