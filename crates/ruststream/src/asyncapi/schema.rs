//! A message type's JSON Schema (from `schemars`), reshaped for an AsyncAPI document:
//! its nested definitions moved under `components/schemas` and every reference pointed
//! there (the AsyncAPI parser refuses `#/$defs/..` references inside a payload).

use serde_json::{Map, Value};

/// The schema of one message type: the type's own schema and the ones it refers to.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct MessageSchema {
    /// The component name of the type's own schema.
    pub(crate) name: String,
    /// Every schema by component name, the type's own included.
    pub(crate) schemas: Vec<(String, Value)>,
}

/// Where a schema's references point in the document.
const COMPONENTS: &str = "#/components/schemas/";

impl MessageSchema {
    /// The schema of `T`, in JSON Schema draft 7 (the base of AsyncAPI's schema format).
    pub(crate) fn of<T: schemars::JsonSchema>() -> Self {
        let generator = schemars::generate::SchemaSettings::draft07().into_generator();
        let root = generator.into_root_schema_for::<T>();
        Self::from_root(root.to_value(), &T::schema_name())
    }

    fn from_root(mut root: Value, type_name: &str) -> Self {
        let mut schemas = Vec::new();
        if let Some(object) = root.as_object_mut() {
            object.remove("$schema");
            for key in ["definitions", "$defs"] {
                if let Some(Value::Object(definitions)) = object.remove(key) {
                    schemas.extend(
                        definitions
                            .into_iter()
                            .map(|(n, s)| (component_name(&n), s)),
                    );
                }
            }
        }
        let name = component_name(type_name);
        schemas.insert(0, (name.clone(), root));
        for (_, schema) in &mut schemas {
            repoint(schema);
        }
        Self { name, schemas }
    }
}

/// A name AsyncAPI accepts as a component key (`[A-Za-z0-9._-]`): other characters
/// become `_`.
pub(crate) fn component_name(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Points every `$ref` at `#/components/schemas/`.
fn repoint(schema: &mut Value) {
    match schema {
        Value::Object(object) => {
            if let Some(Value::String(target)) = object.get_mut("$ref") {
                let name = target
                    .strip_prefix("#/definitions/")
                    .or_else(|| target.strip_prefix("#/$defs/"));
                if let Some(name) = name {
                    *target = format!("{COMPONENTS}{}", component_name(name));
                }
            }
            object.values_mut().for_each(repoint);
        }
        Value::Array(items) => items.iter_mut().for_each(repoint),
        _ => {}
    }
}

/// The payload schema of a message whose type was not declared: any value.
pub(crate) fn open_payload(registration: &str) -> Value {
    let mut open = Map::new();
    open.insert(
        "description".to_owned(),
        Value::String(format!(
            "No schema declared for `{registration}`: any payload. Declare one with \
             `.schema::<T>()` on a type deriving `schemars::JsonSchema`."
        )),
    );
    Value::Object(open)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::MessageSchema;

    #[test]
    fn nested_definitions_move_to_components_and_references_follow() {
        let root = json!({
            "$schema": "http://json-schema.org/draft-07/schema#",
            "title": "Order",
            "type": "object",
            "properties": {"lines": {"type": "array", "items": {"$ref": "#/definitions/Line"}}},
            "definitions": {"Line": {"type": "object", "properties": {"sku": {"$ref": "#/definitions/Sku<u8>"}}},
                            "Sku<u8>": {"type": "string"}}
        });
        let schema = MessageSchema::from_root(root, "Order");
        assert_eq!(schema.name, "Order");
        let names: Vec<&str> = schema.schemas.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["Order", "Line", "Sku_u8_"]);
        let text = serde_json::to_string(&schema.schemas).unwrap();
        assert!(
            !text.contains("#/definitions/") && !text.contains("$schema"),
            "{text}"
        );
        assert!(text.contains("#/components/schemas/Line"), "{text}");
        assert!(text.contains("#/components/schemas/Sku_u8_"), "{text}");
    }
}
