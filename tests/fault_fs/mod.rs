//! A file system for the cache store's fault tests: the real one under a
//! directory, with a hook that can fail any operation or "crash" the
//! process at it, and a model of what a power cut keeps (the pattern of
//! SQLite's test VFS and RocksDB's FaultInjectionTestFS).
//!
//! Every operation happens on the real directory, so the store reads what
//! it wrote and the tests can look at the files. Beside it the model keeps
//! what is durable: each file's content as of its last fsync, and each
//! directory's listing as of its last fsync plus the changes made since
//! (creations, renames, removals). [`FaultFs::power_cut`] rewrites the
//! directory to what survives: by default only what was fsynced; "torn",
//! also a random prefix of each directory's later changes and a random
//! prefix of never-synced file data, as a journalling file system may keep.
//! After a crash every operation fails, as if the process were gone; a
//! process crash (`kill -9`, the page cache kept) is that alone, without
//! the power cut.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use rproxy::cache::{Fs, StdFs};

use crate::support::Rng;

/// What an operation is, for the hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    CreateNew,
    Write,
    SyncFile,
    Rename,
    RemoveFile,
    RemoveDirAll,
    CreateDir,
    SyncDir,
    OpenRead,
}

/// One operation as the hook sees it.
#[derive(Debug)]
pub struct Op<'a> {
    pub kind: Kind,
    pub path: &'a Path,
    /// A rename's target.
    pub to: Option<&'a Path>,
}

impl Op<'_> {
    /// Whether the operation's (target) file name ends with `suffix`.
    pub fn targets(&self, suffix: &str) -> bool {
        self.to
            .unwrap_or(self.path)
            .to_str()
            .is_some_and(|p| p.ends_with(suffix))
    }
}

/// What the hook decides.
pub enum Verdict {
    /// Do it.
    Go,
    /// Fail with this errno, doing nothing.
    Fail(i32),
    /// The process dies here: this and every later operation fail.
    Crash,
}

pub type Hook = Box<dyn FnMut(&Op<'_>) -> Verdict + Send>;

type NodeId = u64;
const ROOT: NodeId = 0;

enum Node {
    /// A file and its content as of its last fsync.
    File {
        synced: Option<Vec<u8>>,
    },
    Dir,
}

/// One change to a directory's listing, applied whole: a rename inside one
/// directory changes two names at once.
type DirChange = Vec<(OsString, Option<NodeId>)>;

#[derive(Default)]
struct Model {
    dead: bool,
    next_id: NodeId,
    nodes: HashMap<NodeId, Node>,
    /// Path under the root → node, as things are now.
    now: HashMap<PathBuf, NodeId>,
    /// Each directory's listing as of its last fsync.
    durable: HashMap<NodeId, BTreeMap<OsString, NodeId>>,
    /// Each directory's changes since its last fsync, in order.
    pending: HashMap<NodeId, Vec<DirChange>>,
}

pub struct FaultFs {
    root: PathBuf,
    model: Mutex<Model>,
    hook: Mutex<Hook>,
}

fn crashed() -> io::Error {
    io::Error::other("the process crashed (fault test)")
}

impl FaultFs {
    /// Takes `root` as it is on disk as durable, and runs every operation
    /// past `hook`.
    pub fn boot(root: &Path, hook: Hook) -> FaultFs {
        fs::create_dir_all(root).unwrap();
        let mut model = Model::default();
        model.nodes.insert(ROOT, Node::Dir);
        model.durable.insert(ROOT, BTreeMap::new());
        model.now.insert(PathBuf::new(), ROOT);
        model.next_id = ROOT + 1;
        model.scan(root, Path::new(""), ROOT);
        FaultFs {
            root: root.to_path_buf(),
            model: Mutex::new(model),
            hook: Mutex::new(hook),
        }
    }

    /// Whether the process has "crashed".
    pub fn is_dead(&self) -> bool {
        self.model.lock().unwrap().dead
    }

    /// Rewrites the directory to what a power cut now leaves (see the
    /// module doc); the fs stays dead.
    pub fn power_cut(&self, rng: &mut Rng, torn: bool) {
        let mut model = self.model.lock().unwrap();
        model.dead = true;
        let mut survivors = Vec::new();
        model.survivors(&self.root, ROOT, PathBuf::new(), rng, torn, &mut survivors);
        for entry in fs::read_dir(&self.root).unwrap() {
            let entry = entry.unwrap();
            if entry.file_type().unwrap().is_dir() {
                fs::remove_dir_all(entry.path()).unwrap();
            } else {
                fs::remove_file(entry.path()).unwrap();
            }
        }
        for (rel, content) in survivors {
            let path = self.root.join(rel);
            match content {
                None => fs::create_dir(&path).unwrap(),
                Some(bytes) => fs::write(&path, bytes).unwrap(),
            }
        }
    }

    fn rel(&self, path: &Path) -> PathBuf {
        path.strip_prefix(&self.root)
            .unwrap_or_else(|_| panic!("{} is outside the fault fs", path.display()))
            .to_path_buf()
    }

    /// Asks the hook; on `Go` returns the model, locked, for the operation.
    fn admit(
        &self,
        kind: Kind,
        path: &Path,
        to: Option<&Path>,
    ) -> io::Result<MutexGuard<'_, Model>> {
        let mut model = self.model.lock().unwrap();
        if model.dead {
            return Err(crashed());
        }
        let op = Op { kind, path, to };
        match (self.hook.lock().unwrap())(&op) {
            Verdict::Go => Ok(model),
            Verdict::Fail(errno) => Err(io::Error::from_raw_os_error(errno)),
            Verdict::Crash => {
                model.dead = true;
                Err(crashed())
            }
        }
    }
}

impl Model {
    fn new_node(&mut self, node: Node) -> NodeId {
        let id = self.next_id;
        self.next_id += 1;
        if matches!(node, Node::Dir) {
            self.durable.insert(id, BTreeMap::new());
        }
        self.nodes.insert(id, node);
        id
    }

    /// Records what is on disk under `dir` as durable.
    fn scan(&mut self, abs: &Path, rel: &Path, dir: NodeId) {
        for entry in fs::read_dir(abs).unwrap() {
            let entry = entry.unwrap();
            let (name, path) = (entry.file_name(), rel.join(entry.file_name()));
            let id = if entry.file_type().unwrap().is_dir() {
                let id = self.new_node(Node::Dir);
                self.scan(&entry.path(), &path, id);
                id
            } else {
                let content = fs::read(entry.path()).unwrap();
                self.new_node(Node::File {
                    synced: Some(content),
                })
            };
            self.durable.get_mut(&dir).unwrap().insert(name, id);
            self.now.insert(path, id);
        }
    }

    fn dir_of(&self, rel: &Path) -> NodeId {
        self.now[rel.parent().expect("not the root")]
    }

    fn change(&mut self, dir: NodeId, change: DirChange) {
        self.pending.entry(dir).or_default().push(change);
    }

    fn name(rel: &Path) -> OsString {
        rel.file_name().unwrap().to_owned()
    }

    /// Where node `id` is now, if anywhere.
    fn path_of(&self, id: NodeId) -> Option<&PathBuf> {
        self.now.iter().find(|(_, n)| **n == id).map(|(p, _)| p)
    }

    /// What survives a power cut under directory `dir`, as (path, content;
    /// `None` for a directory), parents first.
    fn survivors(
        &self,
        root: &Path,
        dir: NodeId,
        rel: PathBuf,
        rng: &mut Rng,
        torn: bool,
        out: &mut Vec<(PathBuf, Option<Vec<u8>>)>,
    ) {
        let mut listing = self.durable[&dir].clone();
        let pending = self.pending.get(&dir).map_or(&[][..], |p| &p[..]);
        let kept = if torn {
            rng.below(pending.len() as u64 + 1) as usize
        } else {
            0
        };
        for change in &pending[..kept] {
            for (name, id) in change {
                match id {
                    Some(id) => listing.insert(name.clone(), *id),
                    None => listing.remove(name),
                };
            }
        }
        for (name, id) in listing {
            let path = rel.join(&name);
            match &self.nodes[&id] {
                Node::Dir => {
                    out.push((path.clone(), None));
                    self.survivors(root, id, path, rng, torn, out);
                }
                Node::File {
                    synced: Some(bytes),
                } => out.push((path, Some(bytes.clone()))),
                Node::File { synced: None } => {
                    let mut bytes = Vec::new();
                    if torn && let Some(now) = self.path_of(id) {
                        bytes = fs::read(root.join(now)).unwrap_or_default();
                        bytes.truncate(rng.below(bytes.len() as u64 + 1) as usize);
                    }
                    out.push((path, Some(bytes)));
                }
            }
        }
    }
}

impl Fs for FaultFs {
    fn create_new(&self, path: &Path) -> io::Result<File> {
        let mut model = self.admit(Kind::CreateNew, path, None)?;
        let file = StdFs.create_new(path)?;
        let rel = self.rel(path);
        let id = model.new_node(Node::File { synced: None });
        let dir = model.dir_of(&rel);
        model.change(dir, vec![(Model::name(&rel), Some(id))]);
        model.now.insert(rel, id);
        Ok(file)
    }

    fn write_all(&self, file: &mut File, path: &Path, data: &[u8]) -> io::Result<()> {
        let _model = self.admit(Kind::Write, path, None)?;
        StdFs.write_all(file, path, data)
    }

    fn sync_file(&self, _file: &File, path: &Path) -> io::Result<()> {
        let mut model = self.admit(Kind::SyncFile, path, None)?;
        // No real fsync: the model is what a power cut keeps, and fsyncs
        // would make the tests slow.
        let content = fs::read(path)?;
        let id = model.now[&self.rel(path)];
        model.nodes.insert(
            id,
            Node::File {
                synced: Some(content),
            },
        );
        Ok(())
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut model = self.admit(Kind::Rename, from, Some(to))?;
        StdFs.rename(from, to)?;
        let (from, to) = (self.rel(from), self.rel(to));
        let id = model.now.remove(&from).expect("renamed a known file");
        assert!(
            matches!(model.nodes[&id], Node::File { .. }),
            "the store renames files only"
        );
        model.now.insert(to.clone(), id);
        let (from_dir, to_dir) = (model.dir_of(&from), model.dir_of(&to));
        let (unlink, link) = ((Model::name(&from), None), (Model::name(&to), Some(id)));
        if from_dir == to_dir {
            model.change(from_dir, vec![unlink, link]);
        } else {
            model.change(from_dir, vec![unlink]);
            model.change(to_dir, vec![link]);
        }
        Ok(())
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        let mut model = self.admit(Kind::RemoveFile, path, None)?;
        StdFs.remove_file(path)?;
        let rel = self.rel(path);
        model.now.remove(&rel);
        let dir = model.dir_of(&rel);
        model.change(dir, vec![(Model::name(&rel), None)]);
        Ok(())
    }

    fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        let mut model = self.admit(Kind::RemoveDirAll, path, None)?;
        StdFs.remove_dir_all(path)?;
        let rel = self.rel(path);
        model.now.retain(|p, _| !p.starts_with(&rel));
        let dir = model.dir_of(&rel);
        model.change(dir, vec![(Model::name(&rel), None)]);
        Ok(())
    }

    fn create_dir(&self, path: &Path) -> io::Result<()> {
        let mut model = self.admit(Kind::CreateDir, path, None)?;
        StdFs.create_dir(path)?;
        let rel = self.rel(path);
        let id = model.new_node(Node::Dir);
        let dir = model.dir_of(&rel);
        model.change(dir, vec![(Model::name(&rel), Some(id))]);
        model.now.insert(rel, id);
        Ok(())
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let mut model = self.admit(Kind::SyncDir, dir, None)?;
        let id = model.now[&self.rel(dir)];
        let changes = model.pending.remove(&id).unwrap_or_default();
        let listing = model.durable.get_mut(&id).unwrap();
        for (name, node) in changes.into_iter().flatten() {
            match node {
                Some(node) => listing.insert(name, node),
                None => listing.remove(&name),
            };
        }
        Ok(())
    }

    fn open_read(&self, path: &Path) -> io::Result<File> {
        let _model = self.admit(Kind::OpenRead, path, None)?;
        StdFs.open_read(path)
    }
}
