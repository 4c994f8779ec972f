//! The soak's figures, its pass rules and its summary, as pure functions.

use std::collections::BTreeMap;

/// Most a process's RSS may grow after the warm-up, in percent.
pub(crate) const MAX_RSS_GROWTH_PCT: f64 = 10.0;
/// Longest a fault's recovery may take, in seconds.
pub(crate) const MAX_RECOVERY_S: f64 = 30.0;

/// One reading of one process.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ProcSample {
    /// Seconds since the start of the run.
    pub(crate) t_s: f64,
    /// The process's role and number, e.g. `relay-1`; kept by its successors.
    pub(crate) name: String,
    pub(crate) pid: u32,
    pub(crate) rss_kb: u64,
    pub(crate) fds: u64,
}

/// RSS growth of each process name, in percent: for each incarnation (pid) of the
/// name, from its first sample at or after its own warm-up (the run's warm-up end,
/// or for a successor started later, its start plus the warm-up's length) to its
/// last sample; the largest over the incarnations that have both. A name whose
/// incarnations were all too short to have a warm-up has no figure.
pub(crate) fn rss_growth(samples: &[ProcSample], warmup_s: f64) -> BTreeMap<String, f64> {
    let mut by_incarnation: BTreeMap<(&str, u32), Vec<&ProcSample>> = BTreeMap::new();
    for s in samples {
        by_incarnation.entry((&s.name, s.pid)).or_default().push(s);
    }
    let mut growth: BTreeMap<String, f64> = BTreeMap::new();
    for ((name, _), mut list) in by_incarnation {
        list.sort_by(|a, b| a.t_s.total_cmp(&b.t_s));
        let born = list[0].t_s;
        // An incarnation sampled from the start of the run began with it.
        let warm_at = if born <= warmup_s {
            warmup_s
        } else {
            born + warmup_s
        };
        let Some(base) = list.iter().find(|s| s.t_s >= warm_at) else {
            continue;
        };
        let Some(last) = list.last() else { continue };
        if last.t_s <= base.t_s || base.rss_kb == 0 {
            continue;
        }
        let pct = (last.rss_kb as f64 - base.rss_kb as f64) * 100.0 / base.rss_kb as f64;
        growth
            .entry(name.to_owned())
            .and_modify(|g| *g = g.max(pct))
            .or_insert(pct);
    }
    growth
}

/// Most the outbox table may grow after the warm-up, in percent, when it also
/// grew by more than [`TABLE_GROWTH_FLOOR_BYTES`]: with retention keeping the
/// live rows few, a table that keeps growing is dead row versions nobody
/// reclaims (no vacuum). A fault's backlog raises the table's high-water mark
/// once, by a few megabytes; the floor keeps that from counting.
pub(crate) const MAX_TABLE_GROWTH_PCT: f64 = 100.0;
/// See [`MAX_TABLE_GROWTH_PCT`].
pub(crate) const TABLE_GROWTH_FLOOR_BYTES: u64 = 64 << 20;

/// How the outbox table grew: its size at the first reading at or after the
/// warm-up, and at the last reading.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct TableGrowth {
    pub(crate) base_bytes: u64,
    pub(crate) end_bytes: u64,
}

impl TableGrowth {
    /// From `(t_s, bytes)` readings; `None` without a reading after the warm-up
    /// and a later one.
    pub(crate) fn of(readings: &[(f64, u64)], warmup_s: f64) -> Option<Self> {
        let base = readings.iter().find(|(t, _)| *t >= warmup_s)?;
        let end = readings.last()?;
        (end.0 > base.0).then_some(Self {
            base_bytes: base.1,
            end_bytes: end.1,
        })
    }

    pub(crate) fn pct(&self) -> f64 {
        (self.end_bytes as f64 - self.base_bytes as f64) * 100.0 / (self.base_bytes.max(1) as f64)
    }

    /// Grew more than both allowances.
    pub(crate) fn too_much(&self) -> bool {
        self.pct() > MAX_TABLE_GROWTH_PCT
            && self.end_bytes.saturating_sub(self.base_bytes) > TABLE_GROWTH_FLOOR_BYTES
    }
}

/// Seconds of the run's commits whose dead row versions a table may hold at most
/// after the warm-up: twice autovacuum's default one-minute nap, so a working
/// autovacuum passes, as the relays' own vacuums (every retention round, 5 s here)
/// do by far. A table nobody vacuums passes it within about two minutes.
pub(crate) const DEAD_ROWS_SECONDS: f64 = 120.0;
/// Dead row versions to allow an order in the outbox: its claim, its mark and
/// retention's delete leave one each (its insert none), a tenth of the attempts
/// roll back (an aborted insert is dead too: 0.11 an order), and batches given
/// back in an outage are claimed again; 0.5 covers the last two.
pub(crate) const DEAD_ROWS_PER_ORDER: f64 = 3.5;
/// The bound never goes under this (a run that committed almost nothing).
pub(crate) const DEAD_ROWS_FLOOR: u64 = 10_000;

/// Most dead row versions a table may hold after the warm-up, for a run that
/// committed `commits_per_s` orders a second.
pub(crate) fn dead_rows_bound(commits_per_s: f64) -> u64 {
    ((DEAD_ROWS_PER_ORDER * DEAD_ROWS_SECONDS * commits_per_s.max(0.0)) as u64).max(DEAD_ROWS_FLOOR)
}

/// The most dead row versions of the readings `(t_s, dead)` at or after the
/// warm-up; `None` without any.
pub(crate) fn peak_dead_rows(readings: &[(f64, u64)], warmup_s: f64) -> Option<u64> {
    readings
        .iter()
        .filter(|(t, _)| *t >= warmup_s)
        .map(|(_, d)| *d)
        .max()
}

/// One injected fault, as reported.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct FaultRecord {
    pub(crate) at_s: f64,
    pub(crate) end_s: f64,
    pub(crate) kind: &'static str,
    /// `None`: latency was not back at steady within the look-ahead.
    pub(crate) recovery_s: Option<f64>,
    pub(crate) note: String,
}

/// Everything the soak measured.
#[derive(Debug, Clone, Default)]
pub(crate) struct Summary {
    pub(crate) duration_s: f64,
    pub(crate) rate: u32,
    pub(crate) seed: u64,
    pub(crate) attempted: u64,
    pub(crate) committed: u64,
    pub(crate) consumed: u64,
    pub(crate) dead: u64,
    pub(crate) lost: u64,
    pub(crate) duplicate_deliveries: u64,
    pub(crate) duplicate_effects: u64,
    pub(crate) delivered_unique: u64,
    pub(crate) latency_p99_ms_steady: Option<f64>,
    pub(crate) rss_growth_pct: BTreeMap<String, f64>,
    /// `None`: no readings of the table after the warm-up.
    pub(crate) outbox_table: Option<TableGrowth>,
    /// [`peak_dead_rows`] of each table.
    pub(crate) dead_rows_peak: BTreeMap<&'static str, Option<u64>>,
    /// [`dead_rows_bound`] of the run.
    pub(crate) dead_rows_bound: u64,
    /// Every process name that ran, so that one without a growth figure shows.
    pub(crate) processes: Vec<String>,
    pub(crate) faults: Vec<FaultRecord>,
    pub(crate) unclean_exits: u64,
    pub(crate) notes: Vec<String>,
}

impl Summary {
    /// The longest recovery (`None` if a fault never recovered).
    pub(crate) fn max_recovery_s(&self) -> Option<f64> {
        self.faults
            .iter()
            .try_fold(0.0_f64, |m, f| f.recovery_s.map(|r| m.max(r)))
    }

    /// The rules the run broke; empty when it passed.
    pub(crate) fn failures(&self) -> Vec<String> {
        let mut f = Vec::new();
        if self.lost > 0 {
            f.push(format!("{} committed orders lost", self.lost));
        }
        if self.duplicate_effects > 0 {
            f.push(format!(
                "{} orders took effect more than once",
                self.duplicate_effects
            ));
        }
        if self.dead > 0 {
            f.push(format!(
                "{} messages dead, the soak provokes none",
                self.dead
            ));
        }
        if self.committed == 0 {
            f.push("no order was committed".to_owned());
        }
        for name in &self.processes {
            match self.rss_growth_pct.get(name) {
                Some(g) if *g > MAX_RSS_GROWTH_PCT => f.push(format!(
                    "{name}'s RSS grew {g:.1} % after the warm-up (at most {MAX_RSS_GROWTH_PCT} %)"
                )),
                Some(_) => {}
                None => f.push(format!("{name} has no RSS figure after its warm-up")),
            }
        }
        match self.outbox_table {
            Some(g) if g.too_much() => f.push(format!(
                "the outbox table grew {:.0} % after the warm-up ({:.1} to {:.1} MiB; at most {MAX_TABLE_GROWTH_PCT} % or {} MiB): dead rows not reclaimed",
                g.pct(),
                g.base_bytes as f64 / 1048576.0,
                g.end_bytes as f64 / 1048576.0,
                TABLE_GROWTH_FLOOR_BYTES >> 20
            )),
            Some(_) => {}
            None => f.push("no reading of the outbox table's size after the warm-up".to_owned()),
        }
        for (table, peak) in &self.dead_rows_peak {
            match peak {
                Some(p) if *p > self.dead_rows_bound => f.push(format!(
                    "{table} held {p} dead row versions after the warm-up (at most {}, {DEAD_ROWS_SECONDS} s of this run's commits): nothing reclaims them",
                    self.dead_rows_bound
                )),
                Some(_) => {}
                None => f.push(format!("no reading of {table}'s dead rows after the warm-up")),
            }
        }
        match self.latency_p99_ms_steady {
            None => f.push(
                "no fault-free window after the warm-up to take the steady latency from".to_owned(),
            ),
            Some(_) => {
                for fault in &self.faults {
                    match fault.recovery_s {
                        Some(r) if r <= MAX_RECOVERY_S => {}
                        Some(r) => f.push(format!(
                            "{} at {:.0} s: latency p99 back at steady after {r:.0} s (at most {MAX_RECOVERY_S} s)",
                            fault.kind, fault.at_s
                        )),
                        None => f.push(format!(
                            "{} at {:.0} s: latency p99 never back at steady",
                            fault.kind, fault.at_s
                        )),
                    }
                }
            }
        }
        if self.unclean_exits > 0 {
            f.push(format!(
                "{} process(es) did not stop cleanly on SIGTERM",
                self.unclean_exits
            ));
        }
        f
    }

    pub(crate) fn passed(&self) -> bool {
        self.failures().is_empty()
    }

    /// `target/soak/summary.json`.
    pub(crate) fn json(&self) -> serde_json::Value {
        let round1 = |v: f64| (v * 10.0).round() / 10.0;
        serde_json::json!({
            "committed": self.committed,
            "consumed": self.consumed,
            "dead": self.dead,
            "lost": self.lost,
            "duplicate_deliveries": self.duplicate_deliveries,
            "duplicate_effects": self.duplicate_effects,
            "latency_p99_ms_steady": self.latency_p99_ms_steady.map(round1),
            "max_recovery_s": self.max_recovery_s().map(round1),
            "rss_growth_pct": self.rss_growth_pct.iter()
                .map(|(k, v)| (k.clone(), serde_json::json!(round1(*v))))
                .collect::<serde_json::Map<_, _>>(),
            "outbox_table_growth_pct": self.outbox_table.map(|g| round1(g.pct())),
            "outbox_table_mib": self.outbox_table.map(|g| serde_json::json!({
                "after_warmup": round1(g.base_bytes as f64 / 1048576.0),
                "end": round1(g.end_bytes as f64 / 1048576.0),
            })),
            "dead_rows_peak": self.dead_rows_peak.iter()
                .map(|(k, v)| ((*k).to_owned(), serde_json::json!(v)))
                .collect::<serde_json::Map<_, _>>(),
            "dead_rows_bound": self.dead_rows_bound,
            "faults": self.faults.iter().map(|f| serde_json::json!({
                "at_s": round1(f.at_s),
                "kind": f.kind,
                "recovery_s": f.recovery_s.map(round1),
                "end_s": round1(f.end_s),
                "note": f.note,
            })).collect::<Vec<_>>(),
            "passed": self.passed(),
            "failures": self.failures(),
            "duration_s": round1(self.duration_s),
            "rate": self.rate,
            "seed": self.seed,
            "attempted": self.attempted,
            "delivered_unique": self.delivered_unique,
            "unclean_exits": self.unclean_exits,
            "notes": self.notes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(t_s: f64, name: &str, pid: u32, rss_kb: u64) -> ProcSample {
        ProcSample {
            t_s,
            name: name.to_owned(),
            pid,
            rss_kb,
            fds: 10,
        }
    }

    #[test]
    fn rss_growth_runs_from_the_end_of_warm_up_to_the_end() {
        let s = [
            sample(0.0, "relay-1", 10, 10_000),
            sample(10.0, "relay-1", 10, 50_000), // warm-up: ignored
            sample(20.0, "relay-1", 10, 100_000),
            sample(90.0, "relay-1", 10, 105_000),
        ];
        let g = rss_growth(&s, 20.0);
        assert_eq!(g.get("relay-1").copied(), Some(5.0));
    }

    #[test]
    fn a_successor_is_measured_after_its_own_warm_up_and_the_worst_incarnation_counts() {
        let s = [
            sample(0.0, "consumer-1", 10, 100_000),
            sample(20.0, "consumer-1", 10, 100_000),
            sample(40.0, "consumer-1", 10, 102_000),
            // Killed at 45 s; the successor starts small and grows during its own
            // warm-up (45..65 s), then by 20 %.
            sample(50.0, "consumer-1", 11, 10_000),
            sample(70.0, "consumer-1", 11, 50_000),
            sample(100.0, "consumer-1", 11, 60_000),
            // Started too late for a warm-up of its own: no figure.
            sample(90.0, "relay-2", 12, 1_000),
            sample(100.0, "relay-2", 12, 9_000),
        ];
        let g = rss_growth(&s, 20.0);
        assert_eq!(g.get("consumer-1").copied(), Some(20.0));
        assert_eq!(g.get("relay-2"), None);
    }

    fn passing() -> Summary {
        Summary {
            committed: 900,
            consumed: 900,
            latency_p99_ms_steady: Some(100.0),
            processes: vec!["relay-1".into()],
            rss_growth_pct: [("relay-1".to_owned(), 3.0)].into(),
            outbox_table: Some(TableGrowth {
                base_bytes: 20 << 20,
                end_bytes: 30 << 20,
            }),
            dead_rows_peak: [("outbox_messages", Some(7_000)), ("outbox_inbox", Some(0))].into(),
            dead_rows_bound: 189_000,
            faults: vec![FaultRecord {
                at_s: 60.0,
                end_s: 63.0,
                kind: "broker_restart",
                recovery_s: Some(12.0),
                note: String::new(),
            }],
            ..Summary::default()
        }
    }

    #[test]
    fn a_clean_run_passes() {
        assert_eq!(passing().failures(), Vec::<String>::new());
        assert_eq!(passing().max_recovery_s(), Some(12.0));
    }

    #[test]
    fn a_lost_order_fails() {
        assert!(
            !Summary {
                lost: 1,
                ..passing()
            }
            .passed()
        );
    }

    #[test]
    fn a_duplicate_effect_fails() {
        assert!(
            !Summary {
                duplicate_effects: 1,
                ..passing()
            }
            .passed()
        );
    }

    #[test]
    fn a_duplicate_delivery_absorbed_by_the_inbox_does_not_fail() {
        assert!(
            Summary {
                duplicate_deliveries: 40,
                ..passing()
            }
            .passed()
        );
    }

    #[test]
    fn a_dead_message_fails() {
        assert!(
            !Summary {
                dead: 1,
                ..passing()
            }
            .passed()
        );
    }

    #[test]
    fn an_outbox_table_that_keeps_growing_fails() {
        let grown = |base_mib: u64, end_mib: u64| Summary {
            outbox_table: Some(TableGrowth {
                base_bytes: base_mib << 20,
                end_bytes: end_mib << 20,
            }),
            ..passing()
        };
        // The soak record without vacuum: 1.1 GB at the end.
        assert!(!grown(150, 1100).passed());
        // Doubled and more, but by less than the floor: a fault's backlog.
        assert!(grown(20, 60).passed());
        // Large, but within 100 %.
        assert!(grown(200, 390).passed());
        assert!(
            !Summary {
                outbox_table: None,
                ..passing()
            }
            .passed()
        );
        let g = TableGrowth::of(&[(10.0, 5), (30.0, 100), (50.0, 150), (70.0, 400)], 20.0)
            .expect("readings after the warm-up");
        assert_eq!((g.base_bytes, g.end_bytes), (100, 400));
        assert_eq!(TableGrowth::of(&[(10.0, 5), (30.0, 100)], 20.0), None);
    }

    /// The readings of two real 3-minute runs at 450 commits/s (every 10 s to the
    /// end of production, seed 5, autovacuum off on the server): the relays'
    /// vacuum switched off (`OUTBOX__RETENTION__VACUUM=never`), and on.
    #[test]
    fn dead_rows_nobody_reclaims_fail_and_reclaimed_ones_pass() {
        let bound = dead_rows_bound(450.0);
        assert_eq!(bound, 189_000);
        let never: Vec<(f64, u64)> = [
            (10.0, 10_629),
            (20.0, 24_730),
            (30.0, 38_789),
            (40.0, 52_621),
            (50.0, 67_706),
            (60.0, 81_797),
            (70.0, 95_891),
            (80.0, 109_942),
            (90.0, 123_787),
            (100.0, 137_581),
            (110.0, 151_489),
            (120.0, 165_649),
            (130.0, 179_505),
            (140.0, 193_754),
            (150.0, 207_791),
            (160.0, 221_914),
            (170.0, 236_113),
            (180.0, 249_835),
        ]
        .into();
        let vacuumed: Vec<(f64, u64)> = [
            (10.0, 4_428),
            (20.0, 4_279),
            (30.0, 6_431),
            (40.0, 6_511),
            (50.0, 3_295),
            (60.0, 2_953),
            (70.0, 2_912),
            (80.0, 2_887),
            (90.0, 2_891),
            (100.0, 3_764),
            (110.0, 2_738),
            (120.0, 2_629),
            (130.0, 2_619),
            (140.0, 1_126),
            (150.0, 442),
            (160.0, 1_450),
            (170.0, 175),
            (180.0, 6),
        ]
        .into();
        let summary = |readings: &[(f64, u64)]| Summary {
            dead_rows_peak: [("outbox_messages", peak_dead_rows(readings, 36.0))].into(),
            dead_rows_bound: bound,
            ..passing()
        };
        assert!(!summary(&never).passed());
        // Cut at two minutes it still passes: the bound is two minutes' worth.
        assert!(summary(&never[..12]).passed());
        assert!(summary(&vacuumed).passed());
        assert_eq!(peak_dead_rows(&vacuumed, 36.0), Some(6_511));
        // Autovacuum's minute at this rate: about 81,000 before each run.
        assert!(summary(&[(40.0, 20_000), (100.0, 81_000), (110.0, 400)]).passed());
        assert_eq!(dead_rows_bound(1.0), DEAD_ROWS_FLOOR);
        assert_eq!(peak_dead_rows(&[(10.0, 5)], 36.0), None);
        assert!(!summary(&[(10.0, 5)]).passed());
    }

    #[test]
    fn rss_growing_more_than_ten_percent_fails_and_a_process_without_a_figure_too() {
        let grew = Summary {
            rss_growth_pct: [("relay-1".to_owned(), 10.5)].into(),
            ..passing()
        };
        assert!(!grew.passed());
        let at_limit = Summary {
            rss_growth_pct: [("relay-1".to_owned(), 10.0)].into(),
            ..passing()
        };
        assert!(at_limit.passed());
        let unmeasured = Summary {
            rss_growth_pct: BTreeMap::new(),
            ..passing()
        };
        assert!(!unmeasured.passed());
    }

    #[test]
    fn a_slow_or_missing_recovery_fails() {
        let mut slow = passing();
        slow.faults[0].recovery_s = Some(31.0);
        assert!(!slow.passed());
        let mut never = passing();
        never.faults[0].recovery_s = None;
        assert!(!never.passed());
        assert_eq!(never.max_recovery_s(), None);
    }

    #[test]
    fn no_steady_latency_fails() {
        assert!(
            !Summary {
                latency_p99_ms_steady: None,
                ..passing()
            }
            .passed()
        );
    }

    #[test]
    fn an_unclean_exit_or_nothing_committed_fails() {
        assert!(
            !Summary {
                unclean_exits: 1,
                ..passing()
            }
            .passed()
        );
        assert!(
            !Summary {
                committed: 0,
                ..passing()
            }
            .passed()
        );
    }

    #[test]
    fn the_summary_has_the_fields_the_issue_names() {
        let j = passing().json();
        for k in [
            "committed",
            "consumed",
            "dead",
            "lost",
            "duplicate_deliveries",
            "duplicate_effects",
        ] {
            assert!(j[k].is_u64(), "{k} is not an integer: {}", j[k]);
        }
        assert!(j["latency_p99_ms_steady"].is_f64());
        assert!(j["max_recovery_s"].is_f64());
        assert!(j["rss_growth_pct"]["relay-1"].is_f64());
        let f = &j["faults"][0];
        assert!(f["at_s"].is_f64() && f["kind"].is_string() && f["recovery_s"].is_f64());
    }
}
