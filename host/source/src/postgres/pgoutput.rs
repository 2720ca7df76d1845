//! The pgoutput messages (protocol version 1) that carry rows: Relation,
//! Insert, Update, Delete, Truncate. Begin, Commit and logical messages are
//! parsed by the replication client; Type and Origin carry nothing we need.

/// One column of a tuple as pgoutput sends it, borrowed from the message
/// (a row is decoded into values straight from the received bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Datum<'a> {
    Null,
    /// A TOASTed value the update did not change: pgoutput does not send it.
    Unchanged,
    Text(&'a str),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RelationColumn {
    pub name: String,
    pub type_oid: u32,
    pub typmod: i32,
    pub key: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Relation {
    pub oid: u32,
    pub namespace: String,
    pub name: String,
    pub replica_identity: u8,
    pub columns: Vec<RelationColumn>,
}

impl Relation {
    pub fn qualified(&self) -> String {
        format!("{}.{}", self.namespace, self.name)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message<'a> {
    Relation(Relation),
    Insert {
        oid: u32,
        new: Vec<Datum<'a>>,
    },
    Update {
        oid: u32,
        /// `K`: the old key (the key changed); `O`: the whole old row
        /// (REPLICA IDENTITY FULL).
        old: Option<(u8, Vec<Datum<'a>>)>,
        new: Vec<Datum<'a>>,
    },
    Delete {
        oid: u32,
        old: (u8, Vec<Datum<'a>>),
    },
    Truncate {
        oids: Vec<u32>,
    },
    /// Type, Origin, and anything else that carries no rows.
    Other(u8),
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err("pgoutput message is truncated".into());
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn i16(&mut self) -> Result<i16, String> {
        Ok(i16::from_be_bytes(self.take(2)?.try_into().unwrap()))
    }
    fn i32(&mut self) -> Result<i32, String> {
        Ok(i32::from_be_bytes(self.take(4)?.try_into().unwrap()))
    }
    fn string(&mut self) -> Result<String, String> {
        let end = self
            .0
            .iter()
            .position(|&b| b == 0)
            .ok_or("pgoutput string without terminator")?;
        let s = String::from_utf8(self.0[..end].to_vec())
            .map_err(|_| "pgoutput string is not UTF-8")?;
        self.0 = &self.0[end + 1..];
        Ok(s)
    }
    fn tuple(&mut self) -> Result<Vec<Datum<'a>>, String> {
        let n = self.i16()?;
        let mut out = Vec::with_capacity(n.max(0) as usize);
        for _ in 0..n {
            out.push(match self.u8()? {
                b'n' => Datum::Null,
                b'u' => Datum::Unchanged,
                b't' => {
                    let len = self.i32()?;
                    let bytes = self.take(len.max(0) as usize)?;
                    Datum::Text(
                        std::str::from_utf8(bytes).map_err(|_| "pgoutput value is not UTF-8")?,
                    )
                }
                b'b' => return Err("binary pgoutput values are not expected".into()),
                other => return Err(format!("unknown pgoutput tuple tag {other:#x}")),
            });
        }
        Ok(out)
    }
}

pub fn parse(data: &[u8]) -> Result<Message<'_>, String> {
    let mut r = Reader(data);
    let tag = r.u8()?;
    Ok(match tag {
        b'R' => {
            let oid = r.i32()? as u32;
            let namespace = r.string()?;
            let name = r.string()?;
            let replica_identity = r.u8()?;
            let n = r.i16()?;
            let mut columns = Vec::with_capacity(n.max(0) as usize);
            for _ in 0..n {
                let flags = r.u8()?;
                columns.push(RelationColumn {
                    key: flags & 1 == 1,
                    name: r.string()?,
                    type_oid: r.i32()? as u32,
                    typmod: r.i32()?,
                });
            }
            Message::Relation(Relation {
                oid,
                namespace: if namespace.is_empty() {
                    "pg_catalog".into()
                } else {
                    namespace
                },
                name,
                replica_identity,
                columns,
            })
        }
        b'I' => {
            let oid = r.i32()? as u32;
            if r.u8()? != b'N' {
                return Err("Insert without a new tuple".into());
            }
            Message::Insert {
                oid,
                new: r.tuple()?,
            }
        }
        b'U' => {
            let oid = r.i32()? as u32;
            let mut marker = r.u8()?;
            let mut old = None;
            if marker == b'K' || marker == b'O' {
                old = Some((marker, r.tuple()?));
                marker = r.u8()?;
            }
            if marker != b'N' {
                return Err("Update without a new tuple".into());
            }
            Message::Update {
                oid,
                old,
                new: r.tuple()?,
            }
        }
        b'D' => {
            let oid = r.i32()? as u32;
            let marker = r.u8()?;
            if marker != b'K' && marker != b'O' {
                return Err("Delete without an old key or row".into());
            }
            Message::Delete {
                oid,
                old: (marker, r.tuple()?),
            }
        }
        b'T' => {
            let n = r.i32()?;
            let _options = r.u8()?;
            let mut oids = Vec::new();
            for _ in 0..n {
                oids.push(r.i32()? as u32);
            }
            Message::Truncate { oids }
        }
        other => Message::Other(other),
    })
}
