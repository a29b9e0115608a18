use proptest::prelude::*;

use super::*;

fn figures(name: &str, decode: f64, ttft: f64, rss: f64) -> ServerFigures {
    ServerFigures {
        name: name.into(),
        decode_tok_s: Some(decode),
        warm_ttft_ms: Some(ttft),
        peak_rss_mb: Some(rss),
        vetoes: vec![],
    }
}

fn rules(incumbent: &str) -> Rules {
    Rules { weights: Weights::default(), incumbent: incumbent.into(), switch_margin: 0.05 }
}

/// `n` units where each server got the score given.
fn graded(n: usize, scores: &[(&str, f64)]) -> Vec<BTreeMap<String, f64>> {
    (0..n).map(|_| scores.iter().map(|(s, v)| ((*s).to_string(), *v)).collect()).collect()
}

#[test]
fn weights_parse_with_the_documented_defaults() {
    let weights: Weights = "quality=0.4,decode=0.25,ttft=0.2,rss=0.15".parse().expect("weights");
    assert_eq!(weights, Weights::default());
    let errors = ["speed=1", "quality", "ttft= fast", "rss=-1", "quality=0"]
        .map(|text| text.parse::<Weights>().expect_err(text).to_string());
    assert_eq!(
        errors,
        [
            "unknown weight \"speed\"; use quality, decode, ttft, rss",
            "expected key=value, got \"quality\"",
            "ttft: not a number of at least 0: \" fast\"",
            "rss: not a number of at least 0: \"-1\"",
            "every weight is 0",
        ]
    );
}

/// The homelab evaluation's lesson: far faster, but worse answers, is "stay".
#[test]
fn a_much_faster_server_with_worse_answers_loses() {
    let servers = [figures("llama-server", 20.0, 1900.0, 4000.0), figures("fast", 200.0, 100.0, 3000.0)];
    let mut units = graded(10, &[("llama-server", 4.0), ("fast", 2.0)]);
    units.extend(graded(10, &[("llama-server", 4.0), ("fast", 3.0)]));
    let verdict = verdict(&servers, &units, &rules("llama-server")).expect("verdict");
    assert_eq!(verdict.decision, Decision::Stay);
    let fast = &verdict.servers[1];
    assert!(fast.weighted.expect("verdict") > 3.0, "{fast:?}");
    assert_eq!(
        verdict.reason,
        "stay with llama-server: fast scores 6.75 on the weights but its answers are worse (-1.50 ± 0.11 over 20 items)"
    );
}

#[test]
fn a_faster_server_with_answers_as_good_wins() {
    let servers = [figures("a", 20.0, 400.0, 4000.0), figures("b", 30.0, 200.0, 4000.0)];
    let mut units = graded(8, &[("a", 4.0), ("b", 4.0)]);
    units.extend(graded(1, &[("a", 5.0), ("b", 4.0)]));
    units.extend(graded(1, &[("a", 4.0), ("b", 5.0)]));
    let verdict = verdict(&servers, &units, &rules("a")).expect("verdict");
    assert_eq!(verdict.decision, Decision::Switch("b".into()), "{}", verdict.reason);
    // 0.40 × 1 + 0.25 × 1.5 + 0.20 × 2 + 0.15 × 1.
    assert!((verdict.servers[1].weighted.expect("verdict") - 1.325).abs() < 1e-9);
    // 0 ± 0.15 (a standard deviation of √(2/9) over √10).
    let difference = verdict.servers[1].quality_difference.expect("verdict");
    assert!(
        difference.mean.abs() < 1e-9 && (difference.spread - (2.0f64 / 90.0).sqrt()).abs() < 1e-9,
        "{difference:?}"
    );
    assert!(verdict.reason.starts_with("switch to b: weighted score 1.3"), "{}", verdict.reason);
}

#[test]
fn within_the_margin_and_ties_stay() {
    let servers = [figures("a", 20.0, 200.0, 4000.0), figures("b", 20.0, 200.0, 4000.0)];
    let tie = verdict(&servers, &graded(5, &[("a", 3.0), ("b", 3.0)]), &rules("a")).expect("verdict");
    assert_eq!(tie.decision, Decision::Stay);
    assert!(tie.reason.contains("within the 5% margin"), "{}", tie.reason);
    // 4% better on TTFT alone: 1 + 0.2 × 0.04 / 1 < 1.05.
    let slightly = [figures("a", 20.0, 208.0, 4000.0), figures("b", 20.0, 200.0, 4000.0)];
    let verdict = verdict(&slightly, &graded(5, &[("a", 3.0), ("b", 3.0)]), &rules("a")).expect("verdict");
    assert_eq!(verdict.decision, Decision::Stay);
}

#[test]
fn a_vetoed_server_is_never_chosen_and_a_vetoed_incumbent_is_left() {
    let mut broken = figures("b", 100.0, 50.0, 1000.0);
    broken.vetoes.push("tool check failed".into());
    let servers = [figures("a", 20.0, 200.0, 4000.0), broken.clone()];
    let units = graded(5, &[("a", 3.0), ("b", 5.0)]);
    let stay = verdict(&servers, &units, &rules("a")).expect("verdict");
    assert_eq!(stay.decision, Decision::Stay);
    assert!(stay.reason.contains("b fails a must-have (tool check failed)"), "{}", stay.reason);
    // The incumbent failing: the other server is taken without the margin, if its answers hold.
    let slower = figures("a", 19.0, 210.0, 4000.0);
    let leave = verdict(&[broken, slower], &graded(5, &[("a", 3.0), ("b", 3.0)]), &rules("b")).expect("verdict");
    assert_eq!(leave.decision, Decision::Switch("a".into()), "{}", leave.reason);
    assert!(leave.reason.contains("b fails a must-have"), "{}", leave.reason);
}

#[test]
fn without_blind_grades_speed_alone_does_not_decide() {
    let servers = [figures("a", 20.0, 2000.0, 4000.0), figures("b", 200.0, 100.0, 1000.0)];
    let verdict = verdict(&servers, &[], &rules("a")).expect("verdict");
    assert_eq!(verdict.decision, Decision::Stay);
    assert!(verdict.reason.contains("no blind quality grades"), "{}", verdict.reason);
    assert_eq!(verdict.servers[1].ratios.quality, None);
}

#[test]
fn a_missing_metric_leaves_the_weights_of_the_others() {
    let mut no_rss = figures("b", 40.0, 200.0, 0.0);
    no_rss.peak_rss_mb = None;
    let servers = [figures("a", 20.0, 200.0, 4000.0), no_rss];
    let verdict = verdict(&servers, &graded(4, &[("a", 4.0), ("b", 4.0)]), &rules("a")).expect("verdict");
    let b = &verdict.servers[1];
    assert_eq!(b.ratios.rss, None);
    // (0.40 × 1 + 0.25 × 2 + 0.20 × 1) / 0.85.
    assert!((b.weighted.expect("verdict") - 1.1 / 0.85).abs() < 1e-9, "{b:?}");
    assert_eq!(verdict.decision, Decision::Switch("b".into()));
}

#[test]
fn an_unknown_incumbent_is_an_error_and_the_incumbent_comes_first() {
    let servers = [figures("a", 1.0, 1.0, 1.0), figures("b", 1.0, 1.0, 1.0)];
    assert_eq!(verdict(&servers, &[], &rules("c")), Err(VerdictError::UnknownIncumbent("c".into())));
    let verdict = verdict(&servers, &[], &rules("b")).expect("verdict");
    assert_eq!(verdict.servers[0].name, "b");
    assert_eq!(verdict.servers[0].weighted, Some(1.0));
    let json = serde_json::to_value(&verdict).expect("verdict");
    assert_eq!(json["decision"], "stay");
}

fn server_strategy(name: &'static str) -> impl Strategy<Value = (ServerFigures, Vec<f64>)> {
    (1.0..100.0f64, 10.0..5000.0f64, 100.0..9000.0f64, any::<bool>(), prop::collection::vec(1u8..=5, 6)).prop_map(
        move |(decode, ttft, rss, vetoed, scores)| {
            let mut f = figures(name, decode, ttft, rss);
            if vetoed {
                f.vetoes.push("tool check failed".into());
            }
            (f, scores.into_iter().map(f64::from).collect())
        },
    )
}

fn build(servers: &[(ServerFigures, Vec<f64>)]) -> (Vec<ServerFigures>, Vec<BTreeMap<String, f64>>) {
    let figures = servers.iter().map(|(f, _)| f.clone()).collect();
    let units = (0..6).map(|i| servers.iter().map(|(f, s)| (f.name.clone(), s[i])).collect()).collect();
    (figures, units)
}

proptest! {
    /// Whatever the figures: never the incumbent or a vetoed server, and a switch is always
    /// backed by its margin (or a vetoed incumbent) and answers not worse beyond their spread.
    #[test]
    fn a_switch_is_always_backed(
        a in server_strategy("a"), b in server_strategy("b"), c in server_strategy("c"),
        margin in 0.0..0.5f64,
    ) {
        let (figures, units) = build(&[a, b, c]);
        let rules = Rules { switch_margin: margin, ..rules("a") };
        let verdict = verdict(&figures, &units, &rules).expect("verdict");
        if let Decision::Switch(name) = &verdict.decision {
            prop_assert_ne!(name.as_str(), "a");
            let chosen = verdict.servers.iter().find(|s| &s.name == name).expect("verdict");
            prop_assert!(chosen.vetoes.is_empty());
            let difference = chosen.quality_difference.expect("verdict");
            prop_assert!(difference.mean >= -difference.spread);
            if verdict.servers[0].vetoes.is_empty() {
                prop_assert!(chosen.weighted.expect("verdict") >= 1.0 + margin);
            }
        }
        prop_assert!(!verdict.reason.is_empty());
    }

    /// Scaling every weight alike, or listing the other servers in another order, changes
    /// nothing.
    #[test]
    fn scale_and_order_do_not_matter(
        a in server_strategy("a"), b in server_strategy("b"), c in server_strategy("c"), scale in 0.1..10.0f64,
    ) {
        let (figures, units) = build(&[a.clone(), b.clone(), c.clone()]);
        let base = verdict(&figures, &units, &rules("a")).expect("verdict");
        let w = Weights::default();
        let scaled = Rules {
            weights: Weights { quality: w.quality * scale, decode: w.decode * scale, ttft: w.ttft * scale, rss: w.rss * scale },
            ..rules("a")
        };
        let scaled = verdict(&figures, &units, &scaled).expect("verdict");
        prop_assert_eq!(&base.decision, &scaled.decision);
        let (reordered, units) = build(&[a, c, b]);
        let reordered = verdict(&reordered, &units, &rules("a")).expect("verdict");
        let weighted = |v: &Verdict, n: &str| v.servers.iter().find(|s| s.name == n).expect("verdict").weighted;
        // An exact tie between b and c would be broken by order; anything else must not be.
        if weighted(&base, "b") != weighted(&base, "c") {
            prop_assert_eq!(&base.decision, &reordered.decision);
        }
    }

    /// A chosen server that gets faster stays chosen.
    #[test]
    fn getting_faster_never_loses_a_switch(
        a in server_strategy("a"), b in server_strategy("b"), faster in 1.0..5.0f64,
    ) {
        let (figures, units) = build(&[a, b]);
        let before = verdict(&figures, &units, &rules("a")).expect("verdict");
        let mut quicker = figures.clone();
        quicker[1].warm_ttft_ms = quicker[1].warm_ttft_ms.map(|t| t / faster);
        quicker[1].decode_tok_s = quicker[1].decode_tok_s.map(|d| d * faster);
        let after = verdict(&quicker, &units, &rules("a")).expect("verdict");
        if before.decision == Decision::Switch("b".into()) {
            prop_assert_eq!(after.decision, Decision::Switch("b".into()));
        }
    }
}
