//! Why a benchmark run could not be made or its results not written, why there is no
//! decision, and why `--weights` does not parse. A server that fails is not one of these: its
//! failures are measurements, recorded in the rows.

use std::path::PathBuf;

/// What stopped `firstword bench`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BenchError {
    /// No server to measure.
    #[error("give at least one --url")]
    NoTargets,
    /// The HTTP client could not be built.
    #[error("{0}")]
    HttpClient(reqwest::Error),
    /// A server does not answer at all.
    #[error("cannot reach {name} at {url}: {error}")]
    Unreachable {
        /// The server's name in the report.
        name: String,
        /// The URL that was tried.
        url: String,
        /// Why the request failed.
        error: reqwest::Error,
    },
    /// The progress bar's template is invalid.
    #[error("{0}")]
    ProgressBar(indicatif::style::TemplateError),
    /// The CSV file cannot be created.
    #[error("{}: {error}", path.display())]
    CreateCsv {
        /// The CSV path.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// Writing the CSV rows failed.
    #[error("{}: {error}", path.display())]
    WriteCsv {
        /// The CSV path.
        path: PathBuf,
        /// Why.
        error: csv::Error,
    },
    /// The chart path does not end in `.svg`.
    #[error("{}: the chart is written as SVG; use a .svg path", .0.display())]
    NotSvg(PathBuf),
    /// No conversation turn succeeded, so the chart would be empty.
    #[error("no successful conversation turns to plot")]
    NothingToPlot,
    /// The media scenario speaks its clips with espeak-ng, which is not installed.
    #[error(
        "the media scenario speaks its clips with espeak-ng, which is not installed: apt-get install espeak-ng \
         (scripts/setup-system.sh media does), or brew install espeak-ng"
    )]
    NoEspeak,
    /// espeak-ng failed to speak a sentence.
    #[error("espeak-ng could not speak {text:?}: {message}")]
    Espeak {
        /// The sentence.
        text: String,
        /// Why.
        message: String,
    },
    /// A server the bench starts itself (`--serve`) did not come up.
    #[error("--serve {name}: {why}")]
    Serve {
        /// The server's name.
        name: String,
        /// Why.
        why: String,
    },
    /// The quality set, the run directory or a grade.
    #[error(transparent)]
    Quality(super::quality::QualityError),
    /// The verdict cannot be made.
    #[error(transparent)]
    Verdict(super::verdict::VerdictError),
    /// Drawing or writing the chart failed.
    #[error("drawing {}: {message}", path.display())]
    Drawing {
        /// The chart path.
        path: PathBuf,
        /// The drawing back-end's message.
        message: String,
    },
}

/// Why [`decide`](super::decide) made no decision: no server passed the tool check.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("no server passed the tool check; no decision")]
pub struct NoDecision;

/// Why a `--weights` text does not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WeightsError {
    /// A part without `=`.
    #[error("expected key=value, got {0:?}")]
    NotKeyValue(String),
    /// A value that is not a number, or a negative one.
    #[error("{key}: not a number of at least 0: {value:?}")]
    NotANumber {
        /// The weight's name, as written.
        key: String,
        /// The value, as written.
        value: String,
    },
    /// A name other than quality, decode, ttft and rss.
    #[error("unknown weight {0:?}; use quality, decode, ttft, rss")]
    Unknown(String),
    /// Every weight is 0: nothing would count.
    #[error("every weight is 0")]
    AllZero,
}
