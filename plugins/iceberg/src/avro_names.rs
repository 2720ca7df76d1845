//! Avro name checks without regular expressions.
//!
//! Every manifest the sink reads or writes carries Avro schemas, and the
//! avro crate checks each schema, namespace and field name in them against
//! the specification's regular expressions. Run as WebAssembly, that regex
//! engine took about a twelfth of the sink's time. The rules are short (an
//! identifier is `[A-Za-z_][A-Za-z0-9_]*`, a namespace is identifiers joined
//! by dots), so they are checked here by hand, with the same answers and
//! the same errors, and installed once per process in place of the regexes.

use apache_avro::AvroResult;
use apache_avro::error::Details;
use apache_avro::schema::Namespace;
use apache_avro::validator::{
    EnumSymbolNameValidator, RecordFieldNameValidator, SchemaNameValidator,
    SchemaNamespaceValidator,
};

/// The specification's patterns, quoted in the errors as the avro crate
/// quotes them.
const SCHEMA_NAME_PATTERN: &str = r"^((?P<namespace>([A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*)?)\.)?(?P<name>[A-Za-z_][A-Za-z0-9_]*)$";
const NAMESPACE_PATTERN: &str = r"^([A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*)?$";

/// `[A-Za-z_][A-Za-z0-9_]*`
fn is_identifier(text: &str) -> bool {
    let mut bytes = text.bytes();
    matches!(bytes.next(), Some(b'A'..=b'Z' | b'a'..=b'z' | b'_'))
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// Empty, or identifiers joined by single dots.
fn is_namespace(text: &str) -> bool {
    text.is_empty() || text.split('.').all(is_identifier)
}

struct HandWritten;

impl SchemaNameValidator for HandWritten {
    fn validate(&self, schema_name: &str) -> AvroResult<(String, Namespace)> {
        // The name is what follows the last dot; what precedes it (perhaps
        // nothing) is the namespace.
        let (namespace, name) = match schema_name.rsplit_once('.') {
            Some((namespace, name)) => (Some(namespace), name),
            None => (None, schema_name),
        };
        if is_identifier(name) && namespace.is_none_or(is_namespace) {
            Ok((name.to_string(), namespace.map(str::to_string)))
        } else {
            Err(Details::InvalidSchemaName(schema_name.to_string(), SCHEMA_NAME_PATTERN).into())
        }
    }
}

impl SchemaNamespaceValidator for HandWritten {
    fn validate(&self, namespace: &str) -> AvroResult<()> {
        verdict(is_namespace(namespace), || {
            Details::InvalidNamespace(namespace.to_string(), NAMESPACE_PATTERN)
        })
    }
}

impl EnumSymbolNameValidator for HandWritten {
    fn validate(&self, symbol: &str) -> AvroResult<()> {
        verdict(is_identifier(symbol), || {
            Details::EnumSymbolName(symbol.to_string())
        })
    }
}

impl RecordFieldNameValidator for HandWritten {
    fn validate(&self, field_name: &str) -> AvroResult<()> {
        verdict(is_identifier(field_name), || {
            Details::FieldName(field_name.to_string())
        })
    }
}

/// Ok when `valid`, else the error `refusal` makes.
fn verdict(valid: bool, refusal: impl FnOnce() -> Details) -> AvroResult<()> {
    if valid { Ok(()) } else { Err(refusal().into()) }
}

/// Installs the checks, once per process; a later call (or one after the
/// avro crate already chose its own) changes nothing.
pub fn install() {
    use apache_avro::validator::{
        set_enum_symbol_name_validator, set_record_field_name_validator, set_schema_name_validator,
        set_schema_namespace_validator,
    };
    let _ = set_schema_name_validator(Box::new(HandWritten));
    let _ = set_schema_namespace_validator(Box::new(HandWritten));
    let _ = set_enum_symbol_name_validator(Box::new(HandWritten));
    let _ = set_record_field_name_validator(Box::new(HandWritten));
}

#[cfg(test)]
mod tests {
    use apache_avro::validator::{
        EnumSymbolNameValidator, RecordFieldNameValidator, SchemaNameValidator,
        SchemaNamespaceValidator,
    };

    use super::HandWritten;

    /// The avro crate's own checks, by its regular expressions.
    struct Specification;
    impl SchemaNameValidator for Specification {
        fn validate(&self, schema_name: &str) -> apache_avro::AvroResult<(String, Option<String>)> {
            let regex = SchemaNameValidator::regex(self);
            let caps = regex.captures(schema_name).ok_or_else(|| {
                apache_avro::Error::from(apache_avro::error::Details::InvalidSchemaName(
                    schema_name.into(),
                    "",
                ))
            })?;
            Ok((
                caps["name"].to_string(),
                caps.name("namespace").map(|s| s.as_str().to_string()),
            ))
        }
    }
    impl SchemaNamespaceValidator for Specification {
        fn validate(&self, namespace: &str) -> apache_avro::AvroResult<()> {
            if SchemaNamespaceValidator::regex(self).is_match(namespace) {
                Ok(())
            } else {
                Err(apache_avro::error::Details::InvalidNamespace(namespace.into(), "").into())
            }
        }
    }
    impl RecordFieldNameValidator for Specification {
        fn validate(&self, name: &str) -> apache_avro::AvroResult<()> {
            if RecordFieldNameValidator::regex(self).is_match(name) {
                Ok(())
            } else {
                Err(apache_avro::error::Details::FieldName(name.into()).into())
            }
        }
    }

    /// Names from manifests (`manifest_entry`, `r2`, `data_file`,
    /// `org.apache.iceberg.x`) and every way to get one wrong.
    const NAMES: &[&str] = &[
        "",
        ".",
        "..",
        "a",
        "_",
        "A9_z",
        "9a",
        "a-b",
        "manifest_entry",
        "r102",
        "org.apache.iceberg",
        "org.apache.iceberg.data_file",
        ".a",
        "a.",
        "a..b",
        ".a.b",
        "a.9b",
        "a.b.",
        "é",
        "a.é",
        "a b",
        "k_1.v_2.w",
    ];

    #[test]
    fn every_name_gets_the_answer_the_specification_regexes_give() {
        for name in NAMES {
            let mine = SchemaNameValidator::validate(&HandWritten, name).ok();
            let theirs = SchemaNameValidator::validate(&Specification, name).ok();
            assert_eq!(mine, theirs, "schema name {name:?}");
            assert_eq!(
                SchemaNamespaceValidator::validate(&HandWritten, name).is_ok(),
                SchemaNamespaceValidator::validate(&Specification, name).is_ok(),
                "namespace {name:?}"
            );
            let field = RecordFieldNameValidator::validate(&Specification, name).is_ok();
            assert_eq!(
                RecordFieldNameValidator::validate(&HandWritten, name).is_ok(),
                field,
                "field name {name:?}"
            );
            assert_eq!(
                EnumSymbolNameValidator::validate(&HandWritten, name).is_ok(),
                field,
                "enum symbol {name:?}"
            );
        }
    }
}
