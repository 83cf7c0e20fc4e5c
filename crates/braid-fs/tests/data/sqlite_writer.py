# One SQLite writer (rollback journal): N transactions `begin immediate; insert; commit`.
# Prints the count committed and failed, then each committed index on its own line.
import sqlite3
import sys

db, who, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
con = sqlite3.connect(db, timeout=60, isolation_level=None)
con.execute("create table if not exists t(who text, i integer)")
ok, failed = [], 0
for i in range(n):
    try:
        con.execute("begin immediate")
        con.execute("insert into t(who, i) values (?, ?)", (who, i))
        con.execute("commit")
        ok.append(i)
    except sqlite3.Error as e:
        failed += 1
        print("error:", e, file=sys.stderr)
        try:
            con.execute("rollback")
        except sqlite3.Error:
            pass
con.close()
print(len(ok), failed)
for i in ok:
    print(i)
