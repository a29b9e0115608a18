//! A Home Assistant home as its conversation integrations write it into the system message, in
//! the three layouts that decide what a prefix cache keeps between turns (issue "a prompt that
//! changes near its start"; docs/home-assistant.md):
//!
//! - [`HeadLayout::Fixed`]: core Home Assistant with the Assist API (2026): instructions and a
//!   static overview of the devices (names and areas; states come through a tool), no clock.
//! - [`HeadLayout::ClockLast`]: the same with every device's state, and "Current time is …"
//!   at the end (core without the Assist API's time tool, `homeassistant/helpers/llm.py`).
//! - [`HeadLayout::ClockFirst`]: "Current Time: …" as the very first line, then a CSV of every
//!   device's state (popular custom conversation integrations).
//! - [`HeadLayout::Unchanged`]: the clock-last layout with nothing moving between turns: what
//!   its turns would cost without a change, the yardstick for a change's own cost (its prompt
//!   is as long as the clock layouts', the fixed layout's is shorter).
//!
//! Between turns the clock moves and one or two devices change state ([`Home::step`]).

/// Where the system message puts what changes between turns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeadLayout {
    /// Nothing changes: instructions and the devices' names and areas.
    Fixed,
    /// The devices' states, then the clock at the end.
    ClockLast,
    /// The clock first, then the devices' states.
    ClockFirst,
    /// The devices' states and the clock at the end, as [`Self::ClockLast`], none of it moving.
    Unchanged,
}

impl HeadLayout {
    /// The layouts, the fixed one first (the others are measured against it).
    pub const ALL: [Self; 4] = [Self::Fixed, Self::Unchanged, Self::ClockLast, Self::ClockFirst];

    /// Its name in reports.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Fixed => "fixed",
            Self::ClockLast => "clock-last",
            Self::ClockFirst => "clock-first",
            Self::Unchanged => "unchanged",
        }
    }

    /// Whether its system message moves between turns (the clock, the devices' states).
    #[must_use]
    pub fn changes(self) -> bool {
        matches!(self, Self::ClockLast | Self::ClockFirst)
    }
}

/// What people ask a voice assistant at home, in turn.
pub const HOME_ASKS: [&str; 8] = [
    "Turn on the kitchen light.",
    "What is the temperature in the living room?",
    "Is the garage door open?",
    "Turn off all the lights in the office.",
    "What time is it?",
    "Set the bedroom thermostat to 20 degrees.",
    "Which windows are open?",
    "Lock the front door, please.",
];

const AREAS: [&str; 6] = ["Kitchen", "Living Room", "Office", "Bedroom", "Garage", "Hallway"];

/// One device: entity id, name, area and state.
#[derive(Clone, Debug)]
struct Device {
    entity_id: String,
    name: String,
    area: &'static str,
    state: String,
}

/// A home's devices and their states.
#[derive(Clone, Debug)]
pub struct Home {
    devices: Vec<Device>,
}

impl Home {
    /// A home of `entities` devices (lights, temperature sensors, plugs, windows) spread over six
    /// areas.
    #[must_use]
    pub fn new(entities: usize) -> Self {
        let devices = (0..entities.max(1))
            .map(|i| {
                let area = AREAS[i % AREAS.len()];
                let (domain, name, state) = match i % 4 {
                    0 => ("light", format!("{area} Light {i}"), if i % 3 == 0 { "on" } else { "off" }.to_string()),
                    1 => ("sensor", format!("{area} Temperature {i}"), format!("{}.{}", 18 + i % 7, i % 10)),
                    2 => ("switch", format!("{area} Plug {i}"), "off".to_string()),
                    _ => ("binary_sensor", format!("{area} Window {i}"), "closed".to_string()),
                };
                let entity_id = format!("{domain}.{}", name.to_lowercase().replace(' ', "_"));
                Device { entity_id, name, area, state }
            })
            .collect();
        Self { devices }
    }

    /// One or two devices change state (which ones follows from `seed`).
    pub fn step(&mut self, seed: usize) {
        for k in 0..=(seed % 2) {
            let i = (seed * 7 + k * 13) % self.devices.len();
            let state = &mut self.devices[i].state;
            *state = match state.as_str() {
                "on" => "off".into(),
                "off" => "on".into(),
                "closed" => "open".into(),
                "open" => "closed".into(),
                value => format!("{:.1}", value.parse::<f32>().unwrap_or(20.0) + 0.3),
            };
        }
    }

    /// The system message in `layout`, `minutes` past 16:00 (seconds follow from the minutes; the
    /// caller keeps both the minutes and the home as they were for [`HeadLayout::Unchanged`]).
    #[must_use]
    pub fn system(&self, layout: HeadLayout, minutes: usize) -> String {
        let clock = format!("{:02}:{:02}:{:02}", (16 + minutes / 60) % 24, minutes % 60, (minutes * 37) % 60);
        let mut text = String::new();
        if layout == HeadLayout::ClockFirst {
            text.push_str(&format!("Current Time: {clock}\n\nAvailable Devices:\n```csv\nentity_id,name,state,area\n"));
            for device in &self.devices {
                text.push_str(&format!("{},{},{},{}\n", device.entity_id, device.name, device.state, device.area));
            }
            text.push_str("```\n\nThe current state of devices is provided in available devices. ");
            text.push_str("Use the tools to control them. Answer in plain text, briefly, to be spoken.");
            return text;
        }
        text.push_str("You are a voice assistant for Home Assistant.\nAnswer questions about the world truthfully.\n");
        text.push_str("Answer in plain text. Keep it simple and to the point.\n");
        text.push_str("Static Context: An overview of the areas and the devices in this smart home:\n");
        let states = matches!(layout, HeadLayout::ClockLast | HeadLayout::Unchanged);
        for device in &self.devices {
            text.push_str(&format!("- names: {}\n", device.name));
            if states {
                text.push_str(&format!("  state: '{}'\n", device.state));
            }
            text.push_str(&format!("  areas: {}\n", device.area));
        }
        if states {
            text.push_str(&format!("Current time is {clock}. Today's date is 2026-12-05."));
        } else {
            text.push_str("Use the GetDateTime tool for the time and GetLiveContext for the devices' states.");
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_clock_layouts_change_between_turns() {
        let mut home = Home::new(12);
        let layouts = [HeadLayout::Fixed, HeadLayout::ClockLast, HeadLayout::ClockFirst];
        let before: Vec<String> = layouts.iter().map(|&l| home.system(l, 0)).collect();
        home.step(3);
        let after: Vec<String> = layouts.iter().map(|&l| home.system(l, 1)).collect();
        assert_eq!(before[0], after[0], "the fixed layout holds neither clock nor states");
        for (b, a) in before.iter().zip(&after).skip(1) {
            assert_ne!(b, a);
        }
        assert!(after[2].starts_with("Current Time: 16:01:37\n"), "{}", after[2]);
        assert!(after[1].ends_with("Current time is 16:01:37. Today's date is 2026-12-05."));
        assert_eq!(home.system(HeadLayout::Unchanged, 1), after[1], "the clock-last text, for a home kept as it was");
        assert!(HeadLayout::ALL.iter().filter(|l| l.changes()).eq(&layouts[1..]));
    }

    #[test]
    fn a_step_changes_one_or_two_states() {
        let home = Home::new(24);
        for seed in 0..8 {
            let mut next = home.clone();
            next.step(seed);
            let changed = home.devices.iter().zip(&next.devices).filter(|(a, b)| a.state != b.state).count();
            assert_eq!(changed, 1 + seed % 2, "seed {seed}");
        }
    }
}
