package millstream.spark.jvm;

import java.io.BufferedOutputStream;
import java.io.File;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.OutputStream;
import java.nio.file.Files;
import java.nio.file.StandardCopyOption;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileAlreadyExistsException;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.Syncable;
import org.apache.spark.sql.execution.streaming.checkpointing.FileContextBasedCheckpointFileManager;

/**
 * Spark's default checkpoint file manager, with a local disk's files written and renamed through
 * java.nio instead of Hadoop's local file system.
 *
 * <p>Without Hadoop's native library (none ships with pyspark), Hadoop's local file system starts
 * a process for every permission it sets ({@code chmod}) and every link it reads ({@code readlink}):
 * about ten per checkpoint file, each costing milliseconds of CPU and of the batch's serial path.
 * Here a temporary file is a plain file, and its rename keeps the two rules Spark's checkpoint
 * needs, atomically: with {@code overwriteIfPossible} it replaces the destination (rename(2): a
 * state store file of a re-run attempt replaces the first attempt's); without, it never does
 * (link(2) fails if the destination exists: a batch's offsets or commit file has one writer).
 * No {@code .crc} files are written: Spark's FileContext reads do not check them.
 *
 * <p>Paths on any other file system (HDFS, object stores) go to Spark's manager unchanged.
 */
public class LocalCheckpointFileManager extends FileContextBasedCheckpointFileManager {

  private final boolean local;

  public LocalCheckpointFileManager(Path path, Configuration hadoopConf) throws IOException {
    super(path, hadoopConf);
    this.local = "file".equals(path.getFileSystem(hadoopConf).makeQualified(path).toUri().getScheme());
  }

  private File file(Path path) {
    return new File(path.toUri().getPath());
  }

  @Override
  public FSDataOutputStream createTempFile(Path path) {
    if (!local) {
      return super.createTempFile(path);
    }
    try {
      File target = file(path);
      Files.createDirectories(target.getParentFile().toPath());
      return new FSDataOutputStream(new LocalOutput(target), null);
    } catch (IOException e) {
      throw rethrow(e);
    }
  }

  @Override
  public void renameTempFile(Path srcPath, Path dstPath, boolean overwriteIfPossible) {
    if (!local) {
      super.renameTempFile(srcPath, dstPath, overwriteIfPossible);
      return;
    }
    java.nio.file.Path src = file(srcPath).toPath();
    java.nio.file.Path dst = file(dstPath).toPath();
    try {
      if (overwriteIfPossible) {
        Files.move(src, dst, StandardCopyOption.ATOMIC_MOVE);
      } else {
        Files.createLink(dst, src);
      }
    } catch (java.nio.file.FileAlreadyExistsException e) {
      deleteIfExists(src);
      // Spark's metadata logs tell a second writer of a batch by this exception.
      throw rethrow(new FileAlreadyExistsException("Failed to rename " + srcPath + " to " + dstPath
          + " as destination already exists"));
    } catch (UnsupportedOperationException | IOException e) {
      // No atomic rename or no hard links here: Spark's own rename (the temporary file is intact).
      super.renameTempFile(srcPath, dstPath, overwriteIfPossible);
      return;
    }
    if (overwriteIfPossible) {
      // A checksum an earlier writer left beside the file no longer matches it.
      deleteIfExists(dst.resolveSibling("." + dst.getFileName() + ".crc"));
    } else {
      deleteIfExists(src);
    }
  }

  private static void deleteIfExists(java.nio.file.Path path) {
    try {
      Files.deleteIfExists(path);
    } catch (IOException e) {
      throw rethrow(e);
    }
  }

  @Override
  public void mkdirs(Path path) {
    if (!local) {
      super.mkdirs(path);
      return;
    }
    try {
      Files.createDirectories(file(path).toPath());
    } catch (IOException e) {
      throw rethrow(e);
    }
  }

  /**
   * Throws {@code e} as it is: these methods override Scala ones, which declare no checked
   * exceptions, while Spark's callers catch Hadoop's IOExceptions by type.
   */
  @SuppressWarnings("unchecked")
  private static <E extends Throwable> RuntimeException rethrow(Throwable e) throws E {
    throw (E) e;
  }

  /** A local file's output stream that can be synced (Spark's state store may ask). */
  private static final class LocalOutput extends OutputStream implements Syncable {
    private final FileOutputStream file;
    private final BufferedOutputStream out;

    LocalOutput(File path) throws IOException {
      this.file = new FileOutputStream(path);
      this.out = new BufferedOutputStream(file, 1 << 16);
    }

    @Override public void write(int b) throws IOException { out.write(b); }
    @Override public void write(byte[] b, int off, int len) throws IOException { out.write(b, off, len); }
    @Override public void flush() throws IOException { out.flush(); }
    @Override public void close() throws IOException { out.close(); }
    @Override public void hflush() throws IOException { out.flush(); }
    @Override public void hsync() throws IOException { out.flush(); file.getFD().sync(); }
  }
}
