//! Lists a template can grow in place, as llama.cpp's template engine allows: Kimi K2's
//! templates keep their call ids in `namespace(ids=[])` and write `ns.ids.append(id)` and
//! `ns.ids.pop(0)`. Minijinja's lists are immutable, so the lists given to `namespace()` become
//! these objects. (transformers' sandbox refuses `append` on any list; tests/template_collection.rs
//! lists this as a known difference.)

use std::sync::{Arc, Mutex, MutexGuard};

use minijinja::value::{Enumerator, Object, ObjectRepr, ValueKind};
use minijinja::{Error, ErrorKind, State, Value};

/// A list with Python's `append`, `extend`, `insert` and `pop`.
#[derive(Debug, Default)]
struct MutableList(Mutex<Vec<Value>>);

impl MutableList {
    fn items(&self) -> MutexGuard<'_, Vec<Value>> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A Python index (negative from the end) into a list of `len` items.
fn position(index: Option<&Value>, len: usize, default: i64) -> Option<usize> {
    let index = match index {
        Some(value) => i64::try_from(value.clone()).ok()?,
        None => default,
    };
    let len = i64::try_from(len).ok()?;
    let at = if index < 0 { len + index } else { index };
    usize::try_from(at).ok()
}

impl Object for MutableList {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Seq
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        let items = self.items();
        items.get(position(Some(key), items.len(), 0)?).cloned()
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Seq(self.items().len())
    }

    fn call_method(self: &Arc<Self>, _state: &State<'_, '_>, method: &str, args: &[Value]) -> Result<Value, Error> {
        let mut items = self.items();
        let wrong = |what: &str| Error::new(ErrorKind::InvalidOperation, format!("list.{method}: {what}"));
        match (method, args) {
            ("append", [value]) => items.push(value.clone()),
            ("extend", [values]) => items.extend(values.try_iter()?),
            ("insert", [index, value]) => {
                let at = position(Some(index), items.len(), 0).unwrap_or(0).min(items.len());
                items.insert(at, value.clone());
            }
            ("pop", [] | [_]) => {
                let at = position(args.first(), items.len(), -1).filter(|&at| at < items.len());
                return at.map(|at| items.remove(at)).ok_or_else(|| wrong("index out of range"));
            }
            ("append" | "extend" | "insert" | "pop", _) => return Err(wrong("wrong number of arguments")),
            _ => return Err(Error::from(ErrorKind::UnknownMethod)),
        }
        Ok(Value::from(()))
    }
}

/// `namespace(…)`, its list values made growable.
pub(super) fn namespace(defaults: Option<Value>) -> Result<Value, Error> {
    let Some(defaults) = defaults else { return minijinja::functions::namespace(None) };
    let Ok(pairs) = defaults.try_iter().map(|keys| keys.collect::<Vec<_>>()) else {
        return minijinja::functions::namespace(Some(defaults));
    };
    if defaults.kind() != ValueKind::Map {
        return minijinja::functions::namespace(Some(defaults));
    }
    let converted: Vec<(Value, Value)> = pairs
        .into_iter()
        .map(|key| {
            let value = defaults.get_item(&key).unwrap_or_default();
            let value = match value.kind() {
                ValueKind::Seq => Value::from_object(MutableList(Mutex::new(value.try_iter()?.collect()))),
                _ => value,
            };
            Ok((key, value))
        })
        .collect::<Result<_, Error>>()?;
    minijinja::functions::namespace(Some(Value::from_iter(converted)))
}
