//! `broadcasts.json`: how each broadcast spread over the connections.
//!
//! The bench writes one entry per broadcast the server sent, with a cumulative delivery
//! curve measured by the clients against the server's send stamp; the report draws one
//! chart per entry (`broadcast_<id>`).

use serde::{Deserialize, Serialize};

/// One broadcast and its delivery curve.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Broadcast {
    pub id: u64,
    /// The server's send stamp, microseconds since the unix epoch.
    pub server_time_us: u64,
    /// Connections the broadcast was meant for.
    pub connections: u64,
    /// Connections that received it.
    pub delivered: u64,
    /// Milliseconds from the stamp until the last delivery.
    pub complete_ms: f64,
    /// (milliseconds since the stamp, connections delivered so far), in time order.
    pub cdf: Vec<(f64, u64)>,
}

impl Broadcast {
    /// Parses `broadcasts.json` (an array of entries).
    pub fn from_json(text: &str) -> crate::Result<Vec<Broadcast>> {
        Ok(serde_json::from_str(text)?)
    }

    /// The chart name for this broadcast.
    pub fn chart_name(&self) -> String {
        format!("broadcast_{}", self.id)
    }

    /// The chart title for this broadcast.
    pub fn chart_title(&self) -> String {
        format!("Broadcast {} delivery", self.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_entries_and_tolerates_missing_fields() {
        let text = r#"[
            {"id": 3, "server_time_us": 1700000000000000, "connections": 4, "delivered": 4,
             "complete_ms": 2.5, "cdf": [[0.5, 1], [1.0, 3], [2.5, 4]], "future": true},
            {"id": 4}
        ]"#;
        let broadcasts = Broadcast::from_json(text).unwrap();
        assert_eq!(broadcasts.len(), 2);
        assert_eq!(broadcasts[0].cdf, vec![(0.5, 1), (1.0, 3), (2.5, 4)]);
        assert_eq!(broadcasts[0].chart_name(), "broadcast_3");
        assert_eq!(broadcasts[1].chart_title(), "Broadcast 4 delivery");
        assert!(broadcasts[1].cdf.is_empty());
    }
}
