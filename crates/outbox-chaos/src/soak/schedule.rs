//! The seeded fault schedule: when each fault happens and which one, as a pure
//! function of the seed and the run's length.
//!
//! Faults arrive as a Poisson process (exponential gaps, mean
//! [`Plan::mean_interval`]), pushed later when needed so that they never overlap:
//! after a fault's nominal length, [`Plan::min_gap`] passes before the next one
//! starts, so each has room to recover. None starts during the warm-up, and none
//! may still be running in the quiet tail at the end, so the run can settle. A run
//! whose random draw leaves no fault gets one at a random time in the window, so a
//! short run still exercises something.

use std::time::Duration;

/// A small seeded generator (SplitMix64): the same seed gives the same schedule on
/// every machine and every version of every dependency.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub(crate) fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `0..n` (`n` > 0).
    pub(crate) fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// Exponential with mean `mean_s`.
    fn exponential(&mut self, mean_s: f64) -> f64 {
        -mean_s * (1.0 - self.unit()).ln()
    }
}

/// The faults of the chaos set that the soak injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum FaultKind {
    /// `rabbitmqctl stop_app`, 3 s, `start_app`.
    BrokerRestart,
    /// SIGKILL of one relay; a successor starts at once.
    RelayKill,
    /// SIGKILL of one consumer; a successor starts at once.
    ConsumerKill,
    /// `pg_terminate_backend` of every connection of the relays and consumers.
    PgConnKill,
    /// `redis-cli shutdown`, 9 s, Redis started again.
    RedisOutage,
    /// The relay holding the sweep lock is SIGSTOPped past the lock's and the
    /// claims' leases, then SIGCONTed.
    LockHolderPause,
}

impl FaultKind {
    pub(crate) const ALL: [Self; 6] = [
        Self::BrokerRestart,
        Self::RelayKill,
        Self::ConsumerKill,
        Self::PgConnKill,
        Self::RedisOutage,
        Self::LockHolderPause,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::BrokerRestart => "broker_restart",
            Self::RelayKill => "relay_kill",
            Self::ConsumerKill => "consumer_kill",
            Self::PgConnKill => "pg_conn_kill",
            Self::RedisOutage => "redis_outage",
            Self::LockHolderPause => "lock_holder_pause",
        }
    }

    /// The longest the fault itself may take (from its start until the service is
    /// back or the successor started), for spacing the schedule.
    pub(crate) fn nominal(self) -> Duration {
        Duration::from_secs(match self {
            // stop_app, 3 s down, start_app (which can take 10 s and more).
            Self::BrokerRestart => 20,
            Self::RelayKill | Self::ConsumerKill | Self::PgConnKill => 2,
            Self::RedisOutage => 12,
            // Up to 30 s to catch the holder with the lock, then paused 8 s.
            Self::LockHolderPause => 40,
        })
    }
}

/// One planned fault.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Planned {
    /// Seconds since the start of the run.
    pub(crate) at_s: f64,
    pub(crate) kind: FaultKind,
    /// Which of the two relays or consumers (0 or 1), where it matters.
    pub(crate) target: usize,
}

/// The shape of a run, for the schedule.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Plan {
    pub(crate) duration: Duration,
    pub(crate) warmup: Duration,
    pub(crate) quiet_tail: Duration,
    pub(crate) mean_interval: Duration,
    pub(crate) min_gap: Duration,
}

impl Plan {
    /// The soak's plan for a run of `duration`: warm-up the first 20 %, a quiet tail
    /// of the last 10 % (at least 90 s, so that even a short run has undisturbed
    /// windows after its last fault for the steady latency), a fault every 120 s on
    /// average, 45 s at least between the end of one and the start of the next.
    pub(crate) fn for_run(duration: Duration) -> Self {
        Self {
            duration,
            warmup: duration / 5,
            quiet_tail: (duration / 10).max(Duration::from_secs(90)),
            mean_interval: Duration::from_secs(120),
            min_gap: Duration::from_secs(45),
        }
    }
}

/// The faults of a run, in time order.
pub(crate) fn schedule(seed: u64, plan: &Plan) -> Vec<Planned> {
    let mut rng = Rng::new(seed);
    let start = plan.warmup.as_secs_f64();
    let last_end = plan.duration.saturating_sub(plan.quiet_tail).as_secs_f64();
    let mean = plan.mean_interval.as_secs_f64();
    let gap = plan.min_gap.as_secs_f64();
    let mut faults = Vec::new();
    let mut t = start;
    let mut free_at = start;
    loop {
        t += rng.exponential(mean);
        let kind = FaultKind::ALL[rng.below(FaultKind::ALL.len())];
        let target = rng.below(2);
        let at = t.max(free_at);
        let end = at + kind.nominal().as_secs_f64();
        if end > last_end {
            break;
        }
        faults.push(Planned {
            at_s: at,
            kind,
            target,
        });
        free_at = end + gap;
        t = at;
    }
    if faults.is_empty() {
        let fitting: Vec<FaultKind> = FaultKind::ALL
            .into_iter()
            .filter(|k| start + k.nominal().as_secs_f64() <= last_end)
            .collect();
        if !fitting.is_empty() {
            let kind = fitting[rng.below(fitting.len())];
            let room = last_end - kind.nominal().as_secs_f64() - start;
            faults.push(Planned {
                at_s: start + rng.unit() * room,
                kind,
                target: rng.below(2),
            });
        }
    }
    faults
}

#[cfg(test)]
mod tests {
    use super::*;

    fn minutes(m: u64) -> Plan {
        Plan::for_run(Duration::from_secs(m * 60))
    }

    #[test]
    fn the_same_seed_gives_the_same_schedule_and_another_seed_another() {
        let plan = minutes(60);
        assert_eq!(schedule(7, &plan), schedule(7, &plan));
        assert_ne!(schedule(7, &plan), schedule(8, &plan));
    }

    #[test]
    fn faults_come_every_two_minutes_on_average() {
        // Many long runs: the mean gap between faults is near 120 s (a little more,
        // since a fault that would overlap the previous one waits for it).
        let plan = minutes(24 * 60);
        let mut gaps = Vec::new();
        for seed in 0..20 {
            let f = schedule(seed, &plan);
            gaps.extend(f.windows(2).map(|w| w[1].at_s - w[0].at_s));
        }
        let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
        assert!((115.0..=150.0).contains(&mean), "mean interval {mean:.1} s");
    }

    #[test]
    fn faults_never_overlap_and_leave_warm_up_and_the_tail_alone() {
        for seed in 0..200 {
            let plan = minutes(60);
            let f = schedule(seed, &plan);
            assert!(!f.is_empty());
            for w in f.windows(2) {
                let end = w[0].at_s + w[0].kind.nominal().as_secs_f64();
                assert!(
                    w[1].at_s >= end + plan.min_gap.as_secs_f64(),
                    "seed {seed}: {:?} overlaps {:?}",
                    w[1],
                    w[0]
                );
            }
            for p in &f {
                assert!(p.at_s >= plan.warmup.as_secs_f64());
                assert!(
                    p.at_s + p.kind.nominal().as_secs_f64()
                        <= (plan.duration - plan.quiet_tail).as_secs_f64()
                );
                assert!(p.target < 2);
            }
        }
    }

    #[test]
    fn a_short_run_still_gets_a_fault_and_every_kind_comes_up() {
        let plan = minutes(3);
        let mut kinds = std::collections::HashSet::new();
        for seed in 0..100 {
            let f = schedule(seed, &plan);
            assert!(!f.is_empty(), "seed {seed}: no fault in a 3-minute run");
            kinds.extend(f.iter().map(|p| p.kind));
        }
        assert_eq!(kinds.len(), FaultKind::ALL.len());
    }

    #[test]
    fn a_run_with_room_only_for_short_faults_gets_one_of_those() {
        // 150 s: warm-up 30 s, quiet from 60 s.
        for seed in 0..50 {
            let f = schedule(seed, &Plan::for_run(Duration::from_secs(150)));
            assert_eq!(f.len(), 1, "seed {seed}");
            assert!(f[0].at_s + f[0].kind.nominal().as_secs_f64() <= 60.0);
        }
    }

    #[test]
    fn a_run_too_short_for_any_fault_gets_none() {
        assert!(schedule(1, &Plan::for_run(Duration::from_secs(90))).is_empty());
    }
}
