//! The crate's public API against real files: a synthetic run directory in a tempdir,
//! charts rendered to SVG and PNG, report.html written and the PNGs decoded.

use std::fmt::Write as _;
use std::path::Path;

use hongbao_report::{
    chart_list, dashboard_html, render_png, render_svg, write_report, Broadcast, Series, CHARTS,
};

const HEADER: &str = "unix_second,role,instances,phase,connections,logged_in,cpu_seconds,rss_bytes,shakes,won,\
nothing,overloaded,opens,opened,sends,errors,latency_p50_ms,latency_p99_ms,latency_max_ms,packets_released,\
packets_won,send_packets,shares_opened,net_rx_packets,net_tx_packets,net_rx_bytes,net_tx_bytes,broadcasts,\
broadcast_delivered,a_future_column";

/// About a minute of a run: 20 s connecting, then 30,000 QPS; seconds 30–32 are missing
/// for every role, and cells that do not apply are empty.
fn synthetic_csv() -> String {
    let mut csv = String::from(HEADER);
    csv.push('\n');
    let start = 1_700_000_000u64;
    for t in 0..60u64 {
        if (30..33).contains(&t) {
            continue;
        }
        let second = start + t;
        let phase = if t < 20 { "connect" } else { "qps-30000" };
        let connected = (t * 1000).min(20_000);
        let qps = if t < 20 { 0 } else { 30_000 - (t % 3) * 50 };
        let received = qps.saturating_sub(20);
        let p50 = if t < 20 {
            String::new()
        } else {
            format!("{:.2}", 0.4 + (t % 5) as f64 * 0.01)
        };
        let p99 = if t < 20 {
            String::new()
        } else {
            format!("{:.2}", 3.5 + (t % 7) as f64 * 0.1)
        };
        let max = if t < 20 {
            String::new()
        } else if t == 40 {
            "0".into()
        } else {
            format!("{}", 40 + t * 10)
        };
        let (released, won) = if t < 20 {
            (String::new(), String::new())
        } else {
            ("200".into(), "198".into())
        };
        // load: phase given; server: phase left empty (taken from the load row)
        let _ = writeln!(
            csv,
            "{second},load,2,{phase},{connected},{connected},0.{cpu},{rss},{qps},{w},{n},0,5,5,0,0,{p50},{p99},{max},,,,,,,,,,,",
            cpu = 30 + t % 10,
            rss = 200_000_000 + t * 1_000_000,
            w = qps / 100,
            n = qps - qps / 100,
        );
        let _ = writeln!(
            csv,
            "{second},server,2,,{connected},{connected},0.{cpu},{rss},{received},,,0,,,,0,,,,,,,,,,,,,,",
            cpu = 20 + t % 7,
            rss = 100_000_000 + connected * 3000,
        );
        let _ = writeln!(
            csv,
            "{second},core,1,,,,0.05,{rss},,,,,,,,,,,,{released},{won},{sends},{opened},,,,,,,",
            rss = 50_000_000 + t * 100_000,
            sends = if t > 45 { "100" } else { "" },
            opened = if t > 46 { "297" } else { "" },
        );
        let _ = writeln!(
            csv,
            "{second},host,1,,,,1.{cpu},,,,,,,,,,,,,,,,,{rx},{tx},{rxb},{txb},,,ignored",
            cpu = 10 + t % 9,
            rx = 30_000 + qps,
            tx = 29_000 + qps,
            rxb = 3_000_000 + qps * 60,
            txb = 2_900_000 + qps * 60,
        );
    }
    let columns = HEADER.split(',').count();
    for line in csv.lines() {
        assert_eq!(line.split(',').count(), columns, "{line}");
    }
    csv
}

fn synthetic_broadcast() -> Broadcast {
    Broadcast {
        id: 1,
        server_time_us: 1_700_000_050_000_000,
        connections: 20_000,
        delivered: 19_990,
        complete_ms: 48.5,
        cdf: vec![
            (0.8, 1000),
            (5.0, 9000),
            (12.0, 18_000),
            (30.0, 19_900),
            (48.5, 19_990),
        ],
    }
}

const LEGENDS: &[(&str, &[&str])] = &[
    ("qps", &["client shakes sent/s", "server shakes received/s"]),
    ("shake_packets", &["packets released/s", "packets won/s"]),
    (
        "send_packets",
        &["send packets created/s", "shares opened/s"],
    ),
    ("latency", &["p50", "p99", "max"]),
    ("connections", &["clients connected", "server connections"]),
    ("cpu", &["server", "core", "load", "machine"]),
    ("memory", &["server", "core", "load"]),
    ("network", &["rx packets/s", "tx packets/s"]),
];

#[test]
fn every_chart_renders_to_svg_with_its_legend() {
    let series = Series::from_csv(&synthetic_csv()).unwrap();
    assert!(!series.is_empty());
    assert_eq!(
        CHARTS.iter().map(|c| c.name).collect::<Vec<_>>(),
        LEGENDS.iter().map(|l| l.0).collect::<Vec<_>>()
    );
    for (name, labels) in LEGENDS {
        let svg = render_svg(&series, &[], name).unwrap_or_else(|| panic!("{name} not rendered"));
        assert!(svg.contains("<svg"), "{name}");
        let title = CHARTS.iter().find(|c| c.name == *name).unwrap().title;
        assert!(svg.contains(title), "{name}: title {title:?} missing");
        let texts = svg_texts(&svg);
        assert!(texts.contains(&"seconds"), "{name}: x axis label missing");
        for label in *labels {
            assert!(
                texts.contains(label),
                "{name}: legend {label:?} missing from {texts:?}"
            );
        }
        assert!(
            !svg.contains("no data"),
            "{name}: the synthetic run has data for every line"
        );
        assert!(
            texts.contains(&"qps-30000") && texts.contains(&"connect"),
            "{name}: phase labels missing"
        );
    }
    assert!(render_svg(&series, &[], "nope").is_none());
    assert!(render_svg(&series, &[], "broadcast_1").is_none());

    let broadcast = synthetic_broadcast();
    let svg = render_svg(&series, std::slice::from_ref(&broadcast), "broadcast_1").unwrap();
    assert!(svg.contains("Broadcast 1 delivery"));
    assert!(svg.contains("delivered (19990 of 20000)"));
}

#[test]
fn empty_and_partial_series_still_render() {
    let empty = Series::from_csv("").unwrap();
    assert!(empty.is_empty());
    let header_only = Series::from_csv(&format!("{HEADER}\n")).unwrap();
    let load_only = Series::from_csv(&format!(
        "{HEADER}\n5,load,1,,10,10,0.1,1000,,,,,,,,,,,,,,,,,,,,,,\n"
    ))
    .unwrap();
    let empty_broadcast = Broadcast {
        id: 4,
        ..Broadcast::default()
    };
    for series in [&empty, &header_only, &load_only] {
        for entry in chart_list(std::slice::from_ref(&empty_broadcast)) {
            let svg =
                render_svg(series, std::slice::from_ref(&empty_broadcast), &entry.name).unwrap();
            assert!(svg.contains("<svg"), "{}", entry.name);
        }
    }
    let svg = render_svg(&empty, &[], "qps").unwrap();
    let texts = svg_texts(&svg);
    assert!(texts.contains(&"no data"));
    assert!(texts.contains(&"client shakes sent/s (no data)"));
    let svg = render_svg(&load_only, &[], "memory").unwrap();
    let texts = svg_texts(&svg);
    assert!(
        texts.contains(&"load") && texts.contains(&"core (no data)"),
        "{texts:?}"
    );
    assert!(
        !texts.contains(&"no data"),
        "one line has data, so no 'no data' note"
    );

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("latency.png");
    assert!(render_png(&empty, &[], "latency", &path).unwrap());
    assert!(!render_png(&empty, &[], "nope", &dir.path().join("nope.png")).unwrap());
    assert!(!dir.path().join("nope.png").exists());
    check_png(&path);
}

#[test]
fn write_report_writes_html_and_pngs() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("series.csv"), synthetic_csv()).unwrap();
    let summary = serde_json::json!({
        "connections": {"target": 20000, "peak": 20000, "connect_seconds": 20, "all_connected": true},
        "phases": [{
            "name": "qps-30000", "target_qps": 30000, "seconds": 40,
            "client_qps_median": 29950, "server_qps_median": 29930,
            "latency_ms": {"p50": 0.42, "p99": 3.8, "p999": 9.1, "max": 630.0},
            "overloaded": 0, "errors": 0, "audit_ok": true
        }],
        "audit": {"ok": true, "discrepancies": [], "users_checked": 20000},
        "resources": {"server_rss_bytes": 160000000, "server_cpu_seconds": 21.5},
        "broadcast": {"sent": 1, "delivered": 19990, "connections": 20000, "complete_ms": 48.5,
                      "latency_ms": {"p50": 5.0, "p99": 30.0, "max": 48.5}}
    });
    std::fs::write(dir.path().join("summary.json"), summary.to_string()).unwrap();
    let broadcasts = serde_json::to_string(&[synthetic_broadcast()]).unwrap();
    std::fs::write(dir.path().join("broadcasts.json"), broadcasts).unwrap();

    let written = write_report(dir.path()).unwrap();
    let mut expected: Vec<String> = CHARTS.iter().map(|c| format!("{}.png", c.name)).collect();
    expected.push("broadcast_1.png".into());
    assert_eq!(written, expected);

    let html = std::fs::read_to_string(dir.path().join("report.html")).unwrap();
    assert!(html.contains("Audit: <span class=\"ok\">OK</span>"));
    let audit_at = html.find("Audit:").unwrap();
    assert!(
        audit_at < html.find("Phases").unwrap(),
        "the audit comes first"
    );
    for needle in [
        "qps-30000",
        "29,950",
        "0.42",
        "630",
        "Resources",
        "Broadcast",
        "19,990",
    ] {
        assert!(html.contains(needle), "report.html lacks {needle:?}");
    }
    for entry in chart_list(&[synthetic_broadcast()]) {
        assert!(
            html.contains(&entry.title),
            "report.html lacks {}",
            entry.title
        );
        assert!(html.contains(&format!("href=\"{}.png\"", entry.name)));
    }
    assert_eq!(html.matches("<svg").count(), CHARTS.len() + 1);
    assert!(!html.contains("src=\"http") && !html.contains("href=\"http"));

    for file in &written {
        check_png(&dir.path().join(file));
    }
}

#[test]
fn write_report_without_a_summary_says_so() {
    let dir = tempfile::tempdir().unwrap();
    assert!(write_report(dir.path()).is_err(), "series.csv is required");
    std::fs::write(dir.path().join("series.csv"), synthetic_csv()).unwrap();
    std::fs::write(dir.path().join("broadcasts.json"), "not json").unwrap();
    let written = write_report(dir.path()).unwrap();
    assert_eq!(written.len(), CHARTS.len());
    let html = std::fs::read_to_string(dir.path().join("report.html")).unwrap();
    assert!(html.contains("no summary.json"));
    assert!(html.contains("Audit: not run"));
    assert!(html.contains("broadcasts.json could not be read"));
    assert_eq!(html.matches("<svg").count(), CHARTS.len());
}

#[test]
fn a_failed_audit_is_shown_with_its_discrepancies() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("series.csv"), format!("{HEADER}\n")).unwrap();
    let summary = serde_json::json!({
        "audit": {"ok": false, "discrepancies": [
            {"kind": "user_balance", "user": 42, "phase": null, "server": 1000, "clients": 900}
        ]}
    });
    std::fs::write(dir.path().join("summary.json"), summary.to_string()).unwrap();
    write_report(dir.path()).unwrap();
    let html = std::fs::read_to_string(dir.path().join("report.html")).unwrap();
    assert!(html.contains("FAILED"));
    assert!(html.contains("user_balance"));
    assert!(html.contains("<td class=\"num\">42</td>"));
}

#[test]
fn text_from_the_csv_is_escaped_in_svg() {
    let csv = "unix_second,role,phase,shakes\n1,load,<b>&amp</b>,5\n2,load,<b>&amp</b>,6\n";
    let series = Series::from_csv(csv).unwrap();
    let svg = render_svg(&series, &[], "qps").unwrap();
    assert!(svg_texts(&svg).contains(&"&lt;b&gt;&amp;amp&lt;/b&gt;"));
    assert!(!svg.contains("<b>"));
}

#[test]
fn dashboard_fetches_the_chart_list_and_charts() {
    let page = dashboard_html("hongbao live");
    assert!(page.contains("/v1/charts"));
    assert!(page.contains("/charts/"));
    assert!(page.contains("/v1/latest"));
    assert!(page.contains("<title>hongbao live</title>"));
    let list = serde_json::to_value(chart_list(&[])).unwrap();
    assert_eq!(
        list[0],
        serde_json::json!({"name": "qps", "title": "Client QPS vs server QPS"})
    );
}

/// The text of every `<text>` element, trimmed.
fn svg_texts(svg: &str) -> Vec<&str> {
    svg.split("<text")
        .skip(1)
        .filter_map(|t| {
            t.split_once('>')
                .and_then(|(_, rest)| rest.split_once("</text>"))
        })
        .map(|(content, _)| content.trim())
        .collect()
}

/// A real PNG of chart size with more than one colour in it.
fn check_png(path: &Path) {
    let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut reader = png::Decoder::new(std::io::BufReader::new(file))
        .read_info()
        .unwrap();
    let mut pixels = vec![0; reader.output_buffer_size()];
    let frame = reader.next_frame(&mut pixels).unwrap();
    assert!(
        frame.width >= 800 && frame.height >= 400,
        "{}: {}x{}",
        path.display(),
        frame.width,
        frame.height
    );
    let pixels = &pixels[..frame.buffer_size()];
    let step = frame.color_type.samples();
    let first = &pixels[..step];
    assert!(
        pixels.chunks(step).any(|p| p != first),
        "{}: a single flat colour",
        path.display()
    );
}
