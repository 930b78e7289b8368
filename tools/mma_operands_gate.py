"""Checks, in the PTX of the tensor-core attention kernels, where each mma.sync takes its operands from (a step of
`make cuda-check`).

Every operand register of an mma.sync must be written in its kernel by an ldmatrix (a tile from shared memory) or a
cvt that packs two float32 values into one register of T (accumulators rounded to an A fragment), directly or through
movs. In a forward kernel, every P V product (B from an ldmatrix .trans: V is [k][n] in shared memory) must read P
converted from the scores (A from cvt packs), and every S = Q K^T product Q and K (A and B from plain ldmatrix). A
copy that nvcc drops from device code (std::copy of a fragment, lowered to __builtin_memmove) leaves the P V products
reading whatever the registers held (Q's last fragment) or nothing at all.

    python tools/mma_operands_gate.py FILE.ptx ...   # exit 1 if an mma.sync reads an operand from elsewhere
"""
import re
import sys
from pathlib import Path

ENTRY = re.compile(r"^\.(?:visible )?\.entry (\S+)\(", re.M)
REG = re.compile(r"%\w+")
MMA = re.compile(r"\{([^}]*)\}, \{([^}]*)\}, \{([^}]*)\}, \{([^}]*)\}")  # d, a, b, c
PACK = re.compile(r"cvt\.\w+\.(?:f16|bf16)x2\.f32")  # two float32 values rounded and packed into one register


def instructions(body: str) -> list[tuple[str, str]]:
    """(opcode, operands) of the instructions of a kernel's PTX: directives, labels, predicates and the braces of
    inline-asm blocks dropped; {register groups} kept."""
    lines = []
    for line in body.splitlines():
        line = re.sub(r"^\s*\$?[\w$]+:", "", line.split("//")[0]).strip()
        if line and not line.startswith("."):
            lines.append(line)
    found = []
    for statement in " ".join(lines).split(";"):
        words = re.sub(r"^[\s{}]*(?:@!?%\w+\s+)?", "", statement).split(None, 1)
        if words:
            found.append((words[0], words[1].strip() if len(words) > 1 else ""))
    return found


def first_operand(operands: str) -> str:
    return operands[:operands.index("}") + 1] if operands.startswith("{") else operands.split(",")[0]


def sources(reg: str, writes: dict[str, list[tuple[str, str]]]) -> set[str]:
    """What writes `reg`, through movs of one register: 'ldmatrix', 'ldmatrix.trans', 'pack' (a cvt packing two
    float32 values), 'unwritten', or an other instruction's opcode."""
    found, seen, todo = set(), set(), [reg]
    while todo:
        r = todo.pop()
        if r in seen:
            continue
        seen.add(r)
        if r not in writes:
            found.add("unwritten")
        for opcode, operands in writes.get(r, []):
            rest = operands[len(first_operand(operands)):].lstrip(", ")
            if opcode.startswith("mov.") and REG.fullmatch(rest):
                todo.append(rest)
            elif opcode.startswith("ldmatrix"):
                found.add("ldmatrix.trans" if ".trans" in opcode else "ldmatrix")
            else:
                found.add("pack" if PACK.fullmatch(opcode) else opcode)
    return found


def kernel_problems(name: str, body: str) -> list[str]:
    """The mma.sync products of one kernel that read an operand from elsewhere than expected (see the module doc)."""
    code = instructions(body)
    writes: dict[str, list[tuple[str, str]]] = {}
    for opcode, operands in code:
        for reg in REG.findall(first_operand(operands)):
            writes.setdefault(reg, []).append((opcode, operands))
    forward = "_fwd_" in name
    found, products, p_v = [], 0, 0
    for opcode, operands in code:
        if not opcode.startswith("mma.sync"):
            continue
        products += 1
        _, a, b, _ = MMA.match(operands).groups()
        a_from = set().union(*(sources(r, writes) for r in REG.findall(a)))
        b_from = set().union(*(sources(r, writes) for r in REG.findall(b)))
        ok = (a_from | b_from) <= {"ldmatrix", "ldmatrix.trans", "pack"}
        if forward:
            p_v += b_from == {"ldmatrix.trans"}
            ok = (a_from, b_from) in (({"pack"}, {"ldmatrix.trans"}), ({"ldmatrix"}, {"ldmatrix"}))
        if not ok:
            found.append(f"{name}: mma.sync #{products} reads A from {sorted(a_from)}, B from {sorted(b_from)}"
                         + (" (P V reads P converted from the scores; S = Q K^T reads Q and K)" if forward else ""))
    if products == 0 or (forward and p_v == 0):
        found.append(f"{name}: {products} mma.sync, {p_v} of them P V products")
    return found


def problems(ptx: str) -> list[str]:
    """kernel_problems of every attention_mma kernel in a PTX file."""
    starts = [(m.start(), m.group(1)) for m in ENTRY.finditer(ptx)]
    found = []
    for (start, name), (end, _) in zip(starts, starts[1:] + [(len(ptx), "")]):
        if "attention_mma" in name:
            found += kernel_problems(name, ptx[ptx.index("\n{", start, end):end])  # the body, after the parameters
    return found


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    failed = False
    for path in argv:
        found = problems(Path(path).read_text())
        print(f"{'FAIL' if found else 'ok  '}  mma operands {path}")
        for line in found[:20]:
            print(f"  {line}")
        failed |= bool(found)
    return int(failed)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
