//! The run's directory: the files a quality run writes and grading reads (see the module
//! above for the list). Answers and grades are appended a line at a time and flushed to disk,
//! so that a crash or a closed page loses nothing already given.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::items::QualityItem;
use super::units::{units, Unit};
use super::{Answer, Grade, QualityError, QualitySet};

/// A server's measured figures, as the verdict weighs them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ServerFigures {
    /// The server's name.
    pub name: String,
    /// Median decode speed after the long prompt, tokens per second.
    pub decode_tok_s: Option<f64>,
    /// Mean warm time to first token, ms.
    pub warm_ttft_ms: Option<f64>,
    /// Peak resident memory, MB.
    pub peak_rss_mb: Option<f64>,
    /// Must-haves it failed (the tool check, the media silent-failure probe).
    #[serde(default)]
    pub vetoes: Vec<String>,
}

/// A run's directory.
#[derive(Clone, Debug)]
pub struct RunDir {
    path: PathBuf,
}

impl RunDir {
    const ITEMS: &'static str = "items.jsonl";
    const ANSWERS: &'static str = "answers.jsonl";
    const SECRET: &'static str = "secret";
    const GRADES: &'static str = "grades.jsonl";
    const FIGURES: &'static str = "speed.json";

    /// Makes a new run directory with its secret; refuses one that already holds answers.
    ///
    /// # Errors
    /// [`QualityError::Write`]: the directory or its secret cannot be written, or it holds a
    /// run already.
    pub fn create(path: &Path) -> Result<Self, QualityError> {
        let dir = Self { path: path.to_path_buf() };
        std::fs::create_dir_all(path).map_err(|error| dir.write_error(path, error))?;
        let answers = dir.file(Self::ANSWERS);
        if answers.exists() {
            let error = std::io::Error::new(std::io::ErrorKind::AlreadyExists, "holds a run already: choose another");
            return Err(dir.write_error(&answers, error));
        }
        let secret = format!("{:016x}\n", fastrand::u64(..));
        dir.write(Self::SECRET, secret.as_bytes())?;
        Ok(dir)
    }

    /// An existing run directory.
    ///
    /// # Errors
    /// [`QualityError::Read`]: it is not a directory.
    pub fn open(path: &Path) -> Result<Self, QualityError> {
        if path.is_dir() {
            Ok(Self { path: path.to_path_buf() })
        } else {
            Err(QualityError::Read {
                path: path.to_path_buf(),
                error: std::io::Error::new(std::io::ErrorKind::NotFound, "not a run directory"),
            })
        }
    }

    /// The directory.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A file in the directory.
    #[must_use]
    pub fn file(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    fn write_error(&self, path: &Path, error: std::io::Error) -> QualityError {
        QualityError::Write { path: path.to_path_buf(), error }
    }

    /// Writes a whole file.
    ///
    /// # Errors
    /// [`QualityError::Write`].
    pub fn write(&self, name: &str, bytes: &[u8]) -> Result<(), QualityError> {
        let path = self.file(name);
        std::fs::write(&path, bytes).map_err(|error| self.write_error(&path, error))
    }

    /// Appends one JSON line and flushes it to disk.
    fn append(&self, name: &str, value: &impl Serialize) -> Result<(), QualityError> {
        let path = self.file(name);
        let mut line = serde_json::to_string(value).map_err(|e| self.write_error(&path, e.into()))?;
        line.push('\n');
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|error| self.write_error(&path, error))?;
        file.write_all(line.as_bytes()).and_then(|()| file.sync_data()).map_err(|error| self.write_error(&path, error))
    }

    /// The lines of a JSONL file (none when it does not exist). A last line cut short by a
    /// crash (no newline, not JSON) is left out.
    fn lines<T: DeserializeOwned>(&self, name: &str) -> Result<Vec<T>, QualityError> {
        let path = self.file(name);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(error) => return Err(QualityError::Read { path, error }),
        };
        let torn_end = !text.is_empty() && !text.ends_with('\n');
        let lines: Vec<&str> = text.lines().collect();
        let mut values = Vec::with_capacity(lines.len());
        for (index, line) in lines.iter().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
            match serde_json::from_str(line) {
                Ok(value) => values.push(value),
                Err(_) if torn_end && index + 1 == lines.len() => {}
                Err(error) => {
                    return Err(QualityError::BadLine { path, line: index + 1, message: error.to_string() });
                }
            }
        }
        Ok(values)
    }

    /// Writes the set as asked.
    ///
    /// # Errors
    /// [`QualityError::Write`].
    pub fn write_items(&self, set: &QualitySet) -> Result<(), QualityError> {
        let mut text = String::new();
        for item in &set.items {
            text.push_str(&serde_json::to_string(item).unwrap_or_default());
            text.push('\n');
        }
        self.write(Self::ITEMS, text.as_bytes())
    }

    /// The set as asked.
    ///
    /// # Errors
    /// [`QualityError::Read`] or [`QualityError::BadLine`].
    pub fn items(&self) -> Result<Vec<QualityItem>, QualityError> {
        self.lines(Self::ITEMS)
    }

    /// Appends an answer.
    ///
    /// # Errors
    /// [`QualityError::Write`].
    pub fn append_answer(&self, answer: &Answer) -> Result<(), QualityError> {
        self.append(Self::ANSWERS, answer)
    }

    /// Every answer.
    ///
    /// # Errors
    /// [`QualityError::Read`] or [`QualityError::BadLine`].
    pub fn answers(&self) -> Result<Vec<Answer>, QualityError> {
        self.lines(Self::ANSWERS)
    }

    /// Appends a grade, on disk before this returns.
    ///
    /// # Errors
    /// [`QualityError::Write`].
    pub fn append_grade(&self, grade: &Grade) -> Result<(), QualityError> {
        self.append(Self::GRADES, grade)
    }

    /// Every grade, oldest first.
    ///
    /// # Errors
    /// [`QualityError::Read`] or [`QualityError::BadLine`].
    pub fn grades(&self) -> Result<Vec<Grade>, QualityError> {
        self.lines(Self::GRADES)
    }

    /// The seed of the labels' order.
    ///
    /// # Errors
    /// [`QualityError::Read`]: missing or not 16 hex digits.
    pub fn secret(&self) -> Result<u64, QualityError> {
        let path = self.file(Self::SECRET);
        let text = std::fs::read_to_string(&path).map_err(|error| QualityError::Read { path: path.clone(), error })?;
        u64::from_str_radix(text.trim(), 16).map_err(|e| QualityError::Read {
            path,
            error: std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()),
        })
    }

    /// The grading units of the run.
    ///
    /// # Errors
    /// As [`Self::items`], [`Self::answers`] and [`Self::secret`]; [`QualityError::NoAnswers`]
    /// when there is nothing to grade.
    pub fn units(&self) -> Result<Vec<Unit>, QualityError> {
        let answers = self.answers()?;
        if answers.is_empty() {
            return Err(QualityError::NoAnswers(self.path.clone()));
        }
        Ok(units(&self.items()?, &answers, self.secret()?))
    }

    /// Writes the servers' figures.
    ///
    /// # Errors
    /// [`QualityError::Write`].
    pub fn write_figures(&self, figures: &[ServerFigures]) -> Result<(), QualityError> {
        let text = serde_json::to_string_pretty(figures).unwrap_or_default();
        self.write(Self::FIGURES, text.as_bytes())
    }

    /// The servers' figures (none when the run measured no speed).
    ///
    /// # Errors
    /// [`QualityError::Read`]: the file does not parse.
    pub fn figures(&self) -> Result<Vec<ServerFigures>, QualityError> {
        let path = self.file(Self::FIGURES);
        match std::fs::read_to_string(&path) {
            Ok(text) => serde_json::from_str(&text).map_err(|e| QualityError::Read {
                path,
                error: std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()),
            }),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(error) => Err(QualityError::Read { path, error }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Grader, UnitKey};
    use super::*;

    fn temp_dir(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("firstword-run-dir-{name}-{}-{}", std::process::id(), fastrand::u32(..)));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn grades_survive_a_torn_last_line_and_a_run_is_never_written_twice() {
        let path = temp_dir("torn");
        let dir = RunDir::create(&path).expect("run directory");
        let grade = Grade {
            key: UnitKey { item: "a".into(), sample: 0 },
            grader: Grader::Person,
            scores: [("x".to_string(), 4.0)].into(),
            tie: false,
            reasoning: vec![],
            at: "2026-12-05T20:00:00Z".into(),
        };
        dir.append_grade(&grade).expect("run directory");
        let mut file = std::fs::OpenOptions::new().append(true).open(dir.file(RunDir::GRADES)).expect("run directory");
        file.write_all(b"{\"item\": \"b\", \"sam").expect("run directory");
        assert_eq!(dir.grades().expect("run directory"), std::slice::from_ref(&grade));
        // A bad line in the middle is an error, not silently dropped.
        file.write_all(b"\n").expect("run directory");
        dir.append_grade(&grade).expect("run directory");
        assert!(matches!(dir.grades(), Err(QualityError::BadLine { line: 2, .. })));

        dir.append_answer(&Answer { item: "a".into(), server: "x".into(), ..Answer::default() })
            .expect("run directory");
        assert!(matches!(RunDir::create(&path), Err(QualityError::Write { .. })));
        let secret = dir.secret().expect("run directory");
        assert_eq!(RunDir::open(&path).expect("run directory").secret().expect("run directory"), secret);
        std::fs::remove_dir_all(&path).expect("run directory");
    }

    #[test]
    fn an_empty_run_has_nothing_to_grade() {
        let path = temp_dir("empty");
        let dir = RunDir::create(&path).expect("run directory");
        dir.write_items(&QualitySet::builtin()).expect("run directory");
        assert_eq!(dir.items().expect("run directory"), QualitySet::builtin().items);
        assert!(matches!(dir.units(), Err(QualityError::NoAnswers(_))));
        assert!(dir.figures().expect("run directory").is_empty());
        std::fs::remove_dir_all(&path).expect("run directory");
    }
}
