#!/usr/bin/env python3
"""sweep.py: memplan against what it must never get wrong (run it as tests/sweep.sh).

Runs ./memplan (or the binary given) on:
  options  every numeric option, on the commands that take it, at edge values (0, 1, -1,
           2^32, 2^63, 2^64-1, 2^64, huge, nan, inf, 1e-9, empty, trailing junk, hex, ...)
           on small models;
  huge     every bundled model (models/*.json, models/hf/*.json) at --batch 65536 and
           16777216 with --seq 16777216, for estimate, check, plan and suggest --no-probe;
  files    odd model files: empty, a directory, /dev/null, a FIFO, a NUL in a key, deep
           nesting, duplicate keys, trailing text, huge numbers, ...;
  gpus     odd GPU profiles (--gpu FILE, --gpu NAME through $MEMPLAN_GPUS, help gpus),
           odd --gpu names, and output that cannot be written.

Each run has 10 s and 2 GiB.  The memory limit: ulimit -v cannot work under ASan (it
reserves terabytes of address space for its shadow), nor is an RSS rlimit enforced by
Linux; so a sanitizer binary runs with ASAN_OPTIONS=hard_rss_limit_mb=2048 (ASan's own
thread kills it past that) and every run's peak RSS is read from wait4()'s rusage.

Wrong (each counted, each offending command printed, exit status 1 if any):
  sanitizer  an ASan, UBSan or LeakSanitizer report;
  internal   exit status 5 (except a failed write, where 5 is the documented status);
  exit       any other status outside 0-4 (a signal, an abort);
  timeout    still running after 10 s (killed): a hang or a run too slow;
  memory     peak RSS over 2 GiB;
  message    exit 2-4 without exactly one "memplan: error: " line, or a stderr line that
             does not start with "memplan: ";
  refusal    input that is bad for certain (an option value that is no number or out of
             any range, a broken model file, a GPU profile with a negative size) not refused
             with its status (2 usage, 3 bad input);
  json       --json output (exit 0 or 1) that is not one strict JSON document;
  nan        "nan" or "inf" printed as a number.

Usage (from the repository root): tests/sweep.sh [-j JOBS] [-g GROUP]... [-k SUBSTRING] [-v]
[--keep] [BINARY]; --keep keeps the files the runs read (odd models and profiles), so that the
printed commands can be run again.
Python 3 standard library only.
"""

import argparse
import concurrent.futures
import json
import os
import re
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

TIME_LIMIT_S = 10.0
RSS_LIMIT_MB = 2048

# ---- the matrix ------------------------------------------------------------------------------

# Edge values for every numeric option: integers, sizes and fractions alike.
EDGE = ['0', '1', '-1', '4294967296', '9223372036854775808', '18446744073709551615',
        '18446744073709551616', '1' + '0' * 40, '1e400', 'nan', 'inf', '-inf', '1e-9', '',
        '8x', '0x10', ' 8', '1.5', '-0']
# and a few more for byte sizes
SIZE_EDGE = ['1B', '0.5', '1KiB', '16384TiB', '17179869184GiB', '1e19', '18446744073709551615B', 'GiB']

T4 = ['--gpu', 't4']
USAGE = {2}      # what a bad option value must get
BAD_INPUT = {3}  # what a bad file must get
# option values that are no number at all, or beyond any option's range: always a usage error
NOT_A_VALUE = {'-1', '18446744073709551616', '1' + '0' * 40, '1e400', 'nan', 'inf', '-inf', '', '8x', ' 8'}


def run(group, args, expect=None, env=None, stdout=None, what=None):
    """One run: its argv after memplan, the exit statuses it must end with (None: any of 0-4),
    extra environment, a file for stdout, and what it tries (for the report)."""
    return {'group': group, 'args': args, 'expect': expect, 'env': env or {}, 'stdout': stdout, 'what': what,
            'json': '--json' in args}


def tiny_hf(base, **kw):
    """A bundled HF config made small (2 layers, narrow), for the options that need one."""
    with open(base) as f:
        m = json.load(f)
    m.update(kw)
    return m


def options_matrix(d):
    """Every numeric option, on the commands that take it, at every edge value."""
    tiny = 'models/tiny-test.json'
    llama = os.path.join(d, 'llama-tiny.json')
    t5 = os.path.join(d, 't5-tiny.json')
    moe = os.path.join(d, 'mixtral-tiny.json')
    lora = ['--finetune', 'lora']
    # option -> [(command, model, extra args before the option)]
    where = {
        '--batch': [('estimate', tiny, []), ('plan', tiny, T4), ('check', tiny, T4), ('probe', tiny, ['--backend', 'host'])],
        '--seq': [('estimate', tiny, []), ('plan', tiny, T4), ('check', tiny, ['--batch', '1'] + T4),
                  ('suggest', tiny, ['--no-probe'] + T4), ('probe', tiny, ['--backend', 'host']),
                  ('estimate', llama, []), ('check', llama, ['--batch', '1'] + T4)],
        '--target-seq': [('estimate', t5, []), ('check', t5, ['--batch', '1'] + T4)],
        '--lora-r': [('estimate', llama, lora), ('check', llama, lora + ['--batch', '1'] + T4)],
        '--lora-alpha': [('estimate', llama, lora)],
        '--lora-dropout': [('estimate', llama, lora)],
        '--moe-capacity': [('estimate', moe, []), ('check', moe, ['--batch', '1'] + T4)],
        '--vram': [('plan', tiny, []), ('check', tiny, ['--batch', '1']), ('suggest', tiny, ['--no-probe'])],
        '--activation-budget': [('plan', tiny, [])],
        '--slots': [('estimate', tiny, ['--checkpoint', 'optimal'] + T4), ('plan', tiny, T4),
                    ('check', tiny, ['--batch', '1', '--checkpoint', 'optimal'] + T4), ('suggest', tiny, ['--no-probe'] + T4)],
        '--margin': [('plan', tiny, T4), ('check', tiny, ['--batch', '1'] + T4), ('suggest', tiny, ['--no-probe'] + T4)],
        '--global-batch': [('suggest', tiny, ['--no-probe'] + T4)],
        '--grad-accum': [('estimate', tiny, []), ('plan', tiny, T4), ('check', tiny, ['--batch', '1'] + T4)],
        '--gpus': [('estimate', tiny, ['--parallel', 'ddp']), ('plan', tiny, T4), ('check', tiny, ['--batch', '1'] + T4),
                   ('suggest', tiny, ['--no-probe'] + T4), ('probe', tiny, ['--backend', 'host', '--parallel', 'ddp'])],
        '--nodes': [('estimate', tiny, ['--gpus', '2', '--parallel', 'fsdp']), ('check', tiny, ['--batch', '1'] + T4),
                    ('suggest', tiny, ['--no-probe', '--gpus', '2'] + T4)],
        '--rank': [('probe', tiny, ['--backend', 'host', '--gpus', '2', '--parallel', 'zero3'])],
        '--max-batch': [('suggest', tiny, ['--no-probe'] + T4)],
        '--steps': [('probe', tiny, ['--backend', 'host'])],
        '--device': [('suggest', tiny, ['--no-probe']), ('probe', tiny, [])],
        '--workspace': [('estimate', tiny, []), ('plan', tiny, T4), ('check', tiny, ['--batch', '1'] + T4),
                        ('suggest', tiny, ['--no-probe'] + T4), ('probe', tiny, ['--backend', 'host'])],
        '--context': [('estimate', tiny, []), ('plan', tiny, T4), ('check', tiny, ['--batch', '1'] + T4),
                      ('suggest', tiny, ['--no-probe'] + T4)],
        '--capacity': [('suggest', tiny, ['--no-probe'] + T4), ('probe', tiny, ['--backend', 'host'])],
    }
    # GRPO's generation settings (the decode loop's sizes and the sampling warpers)
    grpo = ['--trainer', 'grpo', '--batch', '8', '--seq', '64', '--completion-length', '32']
    for opt in ('--num-generations', '--steps-per-generation', '--beta', '--temperature', '--top-p', '--top-k',
                '--min-p'):
        where[opt] = [('estimate', llama, grpo), ('check', llama, grpo + T4)]
    where['--completion-length'] = [('estimate', llama, ['--trainer', 'grpo', '--batch', '8', '--seq', '64'])]
    sizes = {'--vram', '--activation-budget', '--workspace', '--context', '--capacity'}
    runs = []
    for opt, places in where.items():
        values = EDGE + (SIZE_EDGE if opt in sizes else [])
        for cmd, model, extra in places:
            for v in values:
                runs.append(run('options', [cmd, model] + extra + [opt, v], expect=USAGE if v in NOT_A_VALUE else None,
                                what=opt))
    # numbers inside option values: --checkpoint segments:K / every:K, --train-blocks ranges
    for v in EDGE:
        bad = USAGE if v in NOT_A_VALUE else None
        for spec in ('segments:', 'every:'):
            what = '--checkpoint ' + spec + 'K'
            runs.append(run('options', ['estimate', tiny, '--checkpoint', spec + v], expect=bad, what=what))
            runs.append(run('options', ['check', tiny, '--batch', '1', '--checkpoint', spec + v] + T4, expect=bad,
                            what=what))
            runs.append(run('options', ['probe', tiny, '--backend', 'host', '--checkpoint', spec + v], expect=bad,
                            what=what))
        for blocks in (v, '0-' + v, v + '-1', v + ',head'):
            runs.append(run('options', ['estimate', llama, '--finetune', 'freeze', '--train-blocks', blocks],
                            what='--train-blocks'))
    # every numeric option at once, at its largest accepted value: the sizes they multiply
    # (llama-tiny: rotary positions take any --seq)
    big = ['--grad-accum', '16777216', '--gpus', '65536', '--nodes', '65536', '--parallel', 'zero3',
           '--slots', '100000', '--workspace', '16384TiB', '--context', '16384TiB', '--json']
    for bs in (['--batch', '16777216', '--seq', '16777216'], ['--batch', '65536', '--seq', '65536']):
        for cmd in ('estimate', 'plan', 'check'):
            runs.append(run('options', [cmd, llama] + bs + big + (T4 if cmd != 'estimate' else []),
                            what='all at their largest'))
        runs.append(run('options', ['suggest', llama, '--no-probe', bs[2], bs[3], '--gpus', '65536', '--nodes', '65536',
                                    '--max-batch', '16777216', '--global-batch', '4294967296', '--json'] + T4,
                        what='all at their largest'))
    return runs


def huge_matrix():
    """Every bundled model at the largest batch and sequence; the options that set the work."""
    models = sorted(f for f in os.listdir('models') if f.endswith('.json'))
    models = ['models/' + f for f in models] + \
             sorted('models/hf/' + f for f in os.listdir('models/hf') if f.endswith('.json'))
    runs = []
    for m in models:
        for batch in ('65536', '16777216'):
            bs = ['--batch', batch, '--seq', '16777216']
            runs.append(run('huge', ['estimate', m] + bs, what=m))
            runs.append(run('huge', ['check', m] + bs + ['--gpu', 'h100-80gb', '--json'], what=m))
            runs.append(run('huge', ['plan', m] + bs + ['--gpu', 'h100-80gb'], what=m))
        runs.append(run('huge', ['suggest', m, '--no-probe', '--seq', '16777216', '--gpu', 'h100-80gb', '--json'],
                        what=m))
    # the largest values of the options that set how much work there is, on a few models
    h100 = ['--gpu', 'h100-80gb']
    for m in ('models/gpt2-124m.json', 'models/llama-70b.json', 'models/hf/qwen2-0.5b.json',
              'models/hf/gemma-3-1b.json', 'models/hf/t5-small.json'):
        runs.append(run('huge', ['plan', m, '--batch', '8', '--activation-budget', '8GiB', '--slots', '100000'],
                        what='--slots 100000'))
    for m in ('models/tiny-test.json', 'models/gpt2-124m.json', 'models/llama-70b.json'):
        runs.append(run('huge', ['suggest', m, '--no-probe', '--gpus', '65536', '--nodes', '65536'] + h100,
                        what='--gpus 65536 --nodes 65536'))
    for m in ('models/llama-70b.json', 'models/hf/mixtral-8x7b.json'):
        for par in ('ddp', 'zero1', 'zero2', 'zero3', 'fsdp', 'fsdp-no-reshard'):
            runs.append(run('huge', ['check', m, '--batch', '1', '--gpus', '65536', '--nodes', '65536', '--parallel',
                                     par, '--json'] + h100, what='--gpus 65536 --nodes 65536'))
    for m in ('models/gpt2-124m.json', 'models/llama-7b.json'):
        runs.append(run('huge', ['suggest', m, '--no-probe', '--max-batch', '16777216', '--global-batch',
                                 '4294967296'] + h100, what='--max-batch 16777216 --global-batch 2^32'))
    return runs


def write(path, data):
    with open(path, 'wb') as f:
        f.write(data if isinstance(data, bytes) else data.encode())
    return path


def files_matrix(d):
    """Odd model files, each for estimate and check: all of them bad input (exit 3) but the
    few marked None, where refusing is not the only right answer."""
    tiny = open('models/tiny-test.json').read()
    qwen = open('models/hf/qwen2-0.5b.json').read()
    f = {}  # name -> (path, expected exit statuses or None)
    f['empty'] = write(os.path.join(d, 'empty.json'), '')
    f['dir'] = os.path.join(d, 'adir.json')
    os.mkdir(f['dir'])
    f['devnull'] = '/dev/null'
    f['devzero'] = '/dev/zero'
    f['fifo'] = os.path.join(d, 'fifo.json')
    os.mkfifo(f['fifo'])
    f['missing'] = os.path.join(d, 'missing.json')
    f['symlink loop'] = os.path.join(d, 'loop.json')
    os.symlink(f['symlink loop'], f['symlink loop'])
    big = os.path.join(d, 'big.json')  # sparse: past the 64 MiB a model file may have
    with open(big, 'wb') as fh:
        fh.write(b'{')
        fh.truncate(65 << 20)
    f['over 64 MiB'] = big
    f['NUL key (escaped)'] = write(os.path.join(d, 'nulkey.json'), tiny.replace('"name"', '"na\\u0000me"', 1))
    f['NUL key (raw)'] = write(os.path.join(d, 'nulraw.json'), tiny.replace('"name"', '"na\0me"', 1))
    f['NUL after'] = write(os.path.join(d, 'nulafter.json'), tiny + '\0')
    f['deep arrays'] = write(os.path.join(d, 'deep1.json'), '[' * 100000 + ']' * 100000)
    f['deep objects'] = write(os.path.join(d, 'deep2.json'), '{"a":' * 5000 + '1' + '}' * 5000)
    deep = {"type": "linear", "in_features": 4, "out_features": 4}
    for _ in range(200):
        deep = {"layers": [deep]}
    f['deep groups'] = write(os.path.join(d, 'deep3.json'),
                             json.dumps({"name": "deep", "input": {"shape": [4]}, "layers": [deep]}))
    f['duplicate key'] = write(os.path.join(d, 'dup1.json'), tiny.replace('"name"', '"name": "a", "name"', 1))
    f['duplicate key (hf)'] = write(os.path.join(d, 'dup2.json'),
                                    qwen.replace('"hidden_size"', '"hidden_size": 64, "hidden_size"'))
    f['trailing text'] = write(os.path.join(d, 'trail1.json'), tiny + 'x')
    f['trailing JSON'] = write(os.path.join(d, 'trail2.json'), tiny + '{}')
    for lit in ('null', '[]', '{}', '1', '"s"', 'true'):
        f['literal ' + lit] = write(os.path.join(d, 'lit%d.json' % len(f)), lit)
    # numbers no model can have, in a memplan model and in an HF config
    nums = {'1e999': '1e999', '30 digits': '123456789012345678901234567890', '2^64': '18446744073709551616',
            '2^64-1': '18446744073709551615', '2^63': '9223372036854775808', '-1': '-1', '1e-9': '1e-9',
            '-0': '-0', '1.5': '1.5', '0': '0'}
    for name, num in nums.items():
        for key, where in (('dim', lambda m: m['layers'][1]['layers'][0]), ('vocab', lambda m: m['layers'][0]['layers'][0]),
                           ('tokens', lambda m: m['input']), ('repeat', lambda m: m['layers'][1]),
                           ('heads', lambda m: m['layers'][1]['layers'][0])):
            m = json.loads(tiny)
            where(m)[key] = 0
            text = json.dumps(m).replace('"%s": 0' % key, '"%s": %s' % (key, num), 1)
            f['%s %s' % (key, name)] = write(os.path.join(d, 'num-%d.json' % len(f)), text)
        for key in ('num_hidden_layers', 'hidden_size', 'vocab_size', 'num_attention_heads', 'intermediate_size',
                    'max_position_embeddings', 'num_key_value_heads'):
            text = re.sub(r'"%s": *[0-9.e+-]+' % key, '"%s": %s' % (key, num), qwen, count=1)
            f['hf %s %s' % (key, name)] = write(os.path.join(d, 'hf-%d.json' % len(f)), text)
    expect = dict((name, BAD_INPUT) for name in f)
    # not necessarily errors: a byte-order mark, bytes that are not UTF-8, a NUL inside a
    # string value, a 100,000-character name, sizes at the edge of 64 bits
    more = {
        'byte-order mark': b'\xef\xbb\xbf' + tiny.encode(),
        'not UTF-8': tiny.encode().replace(b'tiny-test', b'tiny\xff\xfe'),
        'NUL in a value': tiny.replace('"tiny-test"', '"tiny\\u0000test"'),
        'long name': tiny.replace('"tiny-test"', '"' + 'n' * 100000 + '"'),
        'custom 2^64-1 bytes': json.dumps(
            {"name": "c", "input": {"bytes_per_sample": 18446744073709551615},
             "layers": [{"type": "custom", "output_bytes": 18446744073709551615, "saved_bytes": 18446744073709551615,
                         "params": 18446744073709551615, "fwd_flops": 1e308}]}),
    }
    for name, text in more.items():
        f[name] = write(os.path.join(d, 'more-%d.json' % len(f)), text)
        expect[name] = None
    runs = []
    for name, path in f.items():
        runs.append(run('files', ['estimate', path], expect=expect[name], what=name))
        runs.append(run('files', ['check', path, '--batch', '2', '--gpu', 't4', '--json'], expect=expect[name],
                        what=name))
    # the small models the option runs use (written here), as a check that they load
    for name in ('llama-tiny.json', 't5-tiny.json', 'mixtral-tiny.json'):
        runs.append(run('files', ['estimate', os.path.join(d, name)], expect={0}, what='a small model of the sweep'))
    return runs


def gpus_matrix(d):
    """Odd GPU profiles: as --gpu FILE, by name through $MEMPLAN_GPUS, and in help gpus.  A
    profile with a number no GPU has (negative, not a number, 2^64 bytes or more, no memory)
    is bad input: exit 3."""
    t4 = json.load(open('configs/gpus/t4.json'))
    profiles = {}  # label -> (text, bad?)

    def prof(label, bad, **changes):
        p = dict(t4)
        p['name'] = 'odd'
        for k, v in changes.items():
            if v is None:
                p.pop(k, None)
            else:
                p[k] = v
        profiles[label] = (json.dumps(p).encode(), bad)

    mib = ('memory_mib', 'cuda_context_mib', 'nccl_overhead_mib')

    def bad_value(k, v):
        """True: no GPU has it (exit 3); None: either answer may be right."""
        if v is None:
            return k == 'memory_mib'
        if isinstance(v, str) or v < 0:
            return True
        if k == 'memory_mib' and v < 1:
            return True if v == 0 else None  # under a byte
        if k == 'usable_fraction':
            return v == 0 or v > 1
        if k in ('pcie_gbs', 'ib_gbs') and v == 0:
            return True
        if k in mib or k == 'cublas_workspace_bytes':
            return v * (2 ** 20 if k in mib else 1) >= 2 ** 64  # bytes past 64 bits
        return False

    for k in ('memory_mib', 'usable_fraction', 'cuda_context_mib', 'cublas_workspace_bytes', 'nvlink_gbs',
              'pcie_gbs', 'ib_gbs', 'nccl_overhead_mib', 'bandwidth_gbs'):
        for v in (0, -1, 1e-9, 1e-300, 1e308, 18446744073709551616, 18446744073709551615, 4294967296, 'x', None):
            prof('%s=%s' % (k, v), bad_value(k, v), **{k: v})
    for v in (0, -1, 1e308, 1e-300, 'x'):
        prof('tflops=%s' % v, v in (-1, 'x'), tflops={"fp32": v, "tf32": v, "bf16": v, "fp16": v})
    prof('tflops not an object', True, tflops=7)
    prof('no tflops', False, tflops=None)
    for v in ('x.y', '99999999999.99999999999', '-1.-1', '', 7):
        prof('compute_capability=%s' % v, None, compute_capability=v)
    prof('name=number', True, name=7)
    prof('name empty', None, name='')
    prof('name long', None, name='g' * 10000)
    prof('name newline', None, name='a\nb')
    prof('name format', None, name='%s%n%s')
    prof('description long', None, description='d' * 10000)
    prof('description control', None, description='\x1b[2J\r')
    prof('no name', True, name=None)
    t4s = json.dumps(t4)
    profiles['empty'] = (b'', True)
    profiles['null'] = (b'null', True)
    profiles['array'] = (b'[]', True)
    profiles['truncated'] = (t4s[:40].encode(), True)
    profiles['trailing text'] = (t4s.encode() + b'x', True)
    profiles['duplicate key'] = (t4s.replace('"memory_mib"', '"memory_mib": 1, "memory_mib"', 1).encode(), True)
    profiles['NUL'] = (t4s.encode().replace(b'"name"', b'"na\0me"', 1), True)
    profiles['deep'] = (b'{"a":' * 5000 + b'1' + b'}' * 5000, True)
    runs = []
    tiny = 'models/tiny-test.json'
    for i, (label, (text, bad)) in enumerate(sorted(profiles.items())):
        exp = BAD_INPUT if bad else None
        path = write(os.path.join(d, 'gpu-%d.json' % i), text)
        runs.append(run('gpus', ['check', tiny, '--batch', '1', '--gpu', path, '--json'], expect=exp, what=label))
        runs.append(run('gpus', ['plan', tiny, '--gpu', path], expect=exp, what=label))
        runs.append(run('gpus', ['estimate', tiny, '--gpu', path, '--checkpoint', 'optimal'], expect=exp, what=label))
        runs.append(run('gpus', ['suggest', tiny, '--no-probe', '--gpu', path, '--json'], expect=exp, what=label))
        # the same profile found by name, and listed
        pdir = os.path.join(d, 'gpus-%d' % i)
        os.mkdir(pdir)
        write(os.path.join(pdir, 'odd.json'), text)
        env = {'MEMPLAN_GPUS': pdir}
        runs.append(run('gpus', ['check', tiny, '--batch', '1', '--gpu', 'odd'], env=env, expect=exp, what=label))
        runs.append(run('gpus', ['help', 'gpus'], env=env, expect=exp, what=label))
    # odd --gpu names: none of them a profile
    adir = os.path.join(d, 'adir.gpu.json')
    os.mkdir(adir)
    for name in ('', 'nonexistent', '../configs/gpus/t4', 'a' * 5000, '%s%n', '.json', '-', adir, '/dev/null',
                 '/dev/zero', os.path.join(d, 'missing.json'), 't4\n'):
        runs.append(run('gpus', ['check', tiny, '--batch', '1', '--gpu', name], expect={2, 3}, what='--gpu NAME'))
    # output that cannot be written: a timeline onto a directory or a device is refused (2); one
    # whose directory is missing, or stdout full, is a failed write (5, README's exit codes)
    for target in (d, '/dev/full'):
        runs.append(run('gpus', ['estimate', tiny, '--timeline', target], expect={2}, what='--timeline FILE'))
    runs.append(run('gpus', ['estimate', tiny, '--timeline', os.path.join(d, 'no', 'such', 'dir.svg')], expect={5},
                    what='--timeline FILE'))
    for cmd in (['estimate', tiny], ['check', tiny, '--batch', '1'] + T4, ['help', 'gpus']):
        runs.append(run('gpus', cmd, stdout='/dev/full', expect={5}, what='stdout full'))
    return runs


# ---- running one --------------------------------------------------------------------------------

SAN_RE = re.compile(r'ERROR: (AddressSanitizer|LeakSanitizer|UndefinedBehaviorSanitizer)|runtime error:|'
                    r'SUMMARY: (Address|Undefined|Leak)')
RSS_RE = re.compile(r'hard rss limit exhausted|RSS limit')
NAN_RE = re.compile(r'(?<![A-Za-z_])-?(nan|inf)(?![A-Za-z_])', re.IGNORECASE)


def is_asan(binary):
    with open(binary, 'rb') as f:
        return b'__asan_init' in f.read()


class Result:
    pass


def run_one(binary, asan, spec):
    args, stdout_path = spec['args'], spec['stdout']
    env = dict(os.environ)
    env.pop('MEMPLAN_GPUS', None)
    env.update(spec['env'])
    env['ASAN_OPTIONS'] = 'protect_shadow_gap=0:detect_leaks=1:hard_rss_limit_mb=%d:allocator_may_return_null=1' \
                          % RSS_LIMIT_MB
    env['UBSAN_OPTIONS'] = 'print_stacktrace=1'
    out = open(stdout_path, 'wb') if stdout_path else tempfile.TemporaryFile()
    err = tempfile.TemporaryFile()
    t0 = time.monotonic()
    p = subprocess.Popen([binary] + args, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env,
                         start_new_session=True)
    if not asan:  # a plain binary: its address space is a fair memory cap (ASan's is not)
        try:
            lim = 4 * RSS_LIMIT_MB << 20
            resource.prlimit(p.pid, resource.RLIMIT_AS, (lim, lim))
        except OSError:
            pass
    killed = []

    def kill():
        killed.append(True)
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:
            pass

    timer = threading.Timer(TIME_LIMIT_S, kill)
    timer.start()
    _, status, ru = os.wait4(p.pid, 0)  # wait4: the child's peak RSS comes with its status
    timer.cancel()
    p.returncode = os.waitstatus_to_exitcode(status)
    r = Result()
    r.spec = spec
    r.secs = time.monotonic() - t0
    r.rss_mb = ru.ru_maxrss / 1024.0
    r.timed_out = bool(killed)
    r.rc = p.returncode
    if stdout_path:
        r.out = ''
    else:
        out.seek(0)
        r.out = out.read().decode('utf-8', 'replace')
    out.close()
    err.seek(0)
    r.err = err.read(1 << 20).decode('utf-8', 'replace')
    err.close()
    r.problems = classify(r)
    return r


def strict_json(text):
    def bad_constant(c):
        raise ValueError('not JSON: ' + c)
    json.loads(text, parse_constant=bad_constant)


def classify(r):
    """The problems of one run, the worst first: a run that crashed is not also judged on
    its messages."""
    p = []
    san = SAN_RE.search(r.err)
    if r.timed_out:
        p.append('timeout')
    if r.rss_mb > RSS_LIMIT_MB or RSS_RE.search(r.err):
        p.append('memory')
    if san and not RSS_RE.search(r.err):
        p.append('sanitizer')
    if p:
        return p
    if r.rc == 5:
        if 5 not in (r.spec['expect'] or ()):
            p.append('internal')
    elif not 0 <= r.rc <= 4:
        p.append('exit')
    if p:
        return p
    lines = r.err.splitlines()
    errors = sum(1 for l in lines if l.startswith('memplan: error: '))
    if any(not l.startswith('memplan: ') for l in lines) or (r.rc >= 2 and errors != 1) or (r.rc < 2 and errors):
        p.append('message')
    if r.spec['expect'] is not None and r.rc not in r.spec['expect']:
        p.append('refusal')
    if r.rc < 2 and r.spec['json'] and r.out.strip():
        try:
            strict_json(r.out)
        except ValueError:
            p.append('json')
    elif r.rc < 2 and NAN_RE.search(r.out):
        p.append('nan')
    return p


FRAME_RE = re.compile(r'#\d+ 0x[0-9a-f]+ in (\S+) (\S+?)(:\d+)?(:\d+)?$', re.MULTILINE)
UBSAN_AT_RE = re.compile(r'^(\S+:\d+):\d+: runtime error: (.*)$', re.MULTILINE)


def where(r):
    """Where a sanitizer report happened: its first frame (function file:line) and kind."""
    m = UBSAN_AT_RE.search(r.err)
    if m:
        return '%s: %s' % (m.group(1), re.sub(r'-?[0-9][0-9.e+]*', 'N', m.group(2))[:80])
    kind = re.search(r'ERROR: \w+Sanitizer: ([\w-]+)', r.err)
    f = FRAME_RE.search(r.err)
    return '%s in %s %s' % (kind.group(1) if kind else 'report', f.group(1) if f else '?',
                            (f.group(2) + (f.group(3) or '')) if f else '')


def first_line(r):
    """The line of stderr that says what went wrong."""
    lines = r.err.splitlines()
    return next((l for l in lines if SAN_RE.search(l)), next((l for l in lines if l.startswith('memplan:')),
                lines[0] if lines else '(no message)'))[:240]


def cmdline(r):
    """The run as a shell command line (long arguments cut)."""
    env = ''.join('%s=%s ' % (k, shlex.quote(v)) for k, v in r.spec['env'].items())
    redir = ' >' + r.spec['stdout'] if r.spec['stdout'] else ''
    args = [a if len(a) <= 80 else a[:40] + '...(%d chars)' % len(a) for a in r.spec['args']]
    return env + ' '.join(shlex.quote(a) for a in ['memplan'] + args) + redir


# ---- main -----------------------------------------------------------------------------------------

KINDS = ['sanitizer', 'internal', 'exit', 'timeout', 'memory', 'message', 'refusal', 'json', 'nan']


def main():
    ap = argparse.ArgumentParser(description='memplan edge-value sweep (see the top of tests/sweep.py)')
    ap.add_argument('binary', nargs='?', default='./memplan')
    ap.add_argument('-j', '--jobs', type=int, default=2)
    ap.add_argument('-g', '--group', action='append', choices=['options', 'huge', 'files', 'gpus'])
    ap.add_argument('-k', '--filter', help='only the runs whose command line contains this')
    ap.add_argument('-v', '--verbose', action='store_true', help='print every run')
    ap.add_argument('--keep', action='store_true', help='keep the files the runs read, to run them again')
    a = ap.parse_args()
    if not os.path.isdir('models') or not os.path.isdir('configs/gpus'):
        sys.exit('sweep: run from the repository root')
    binary = os.path.abspath(a.binary)
    if not os.access(binary, os.X_OK):
        sys.exit('sweep: %s: not an executable (make first)' % a.binary)
    asan = is_asan(binary)
    d = tempfile.mkdtemp(prefix='memplan-sweep-')
    try:
        small = {
            'llama-tiny.json': tiny_hf('models/hf/llama-3-8b.json', hidden_size=64, intermediate_size=128,
                                       num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
                                       vocab_size=256, max_position_embeddings=256),
            't5-tiny.json': tiny_hf('models/hf/t5-small.json', d_model=32, d_ff=64, d_kv=8, num_heads=4,
                                    num_layers=2, vocab_size=128),
            'mixtral-tiny.json': tiny_hf('models/hf/mixtral-8x7b.json', hidden_size=64, intermediate_size=128,
                                         num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
                                         vocab_size=256, max_position_embeddings=256),
        }
        for name, m in small.items():
            write(os.path.join(d, name), json.dumps(m))
        runs = []
        groups = a.group or ['options', 'huge', 'files', 'gpus']
        if 'options' in groups:
            runs += options_matrix(d)
        if 'huge' in groups:
            runs += huge_matrix()
        if 'files' in groups:
            runs += files_matrix(d)
        if 'gpus' in groups:
            runs += gpus_matrix(d)
        if a.filter:
            runs = [r for r in runs if a.filter in ' '.join(r['args'])]
        print('sweep: %d runs of %s (%s), %d at a time, %.0f s and %d MiB each' %
              (len(runs), a.binary, 'sanitizers' if asan else 'no sanitizers', a.jobs, TIME_LIMIT_S, RSS_LIMIT_MB),
              flush=True)
        t0 = time.monotonic()
        results = []
        with concurrent.futures.ThreadPoolExecutor(max_workers=a.jobs) as ex:
            for r in ex.map(lambda s: run_one(binary, asan, s), runs):
                results.append(r)
                if a.verbose:
                    print('%5.2fs %6.0fM exit %3d %s%s' % (r.secs, r.rss_mb, r.rc, cmdline(r),
                                                          ' :: ' + ','.join(r.problems) if r.problems else ''),
                          flush=True)
        wall = time.monotonic() - t0
    finally:
        if not a.keep:
            shutil.rmtree(d, ignore_errors=True)
    bad = [r for r in results if r.problems]
    for kind in KINDS:
        hit = [r for r in bad if kind in r.problems]
        if not hit:
            continue
        print('\n== %s: %d' % (kind, len(hit)))
        subjects = {}  # sanitizer reports by where they happen, the rest by what the runs try
        for r in hit:
            key = where(r) if kind == 'sanitizer' else '%s%s' % (r.spec['group'], ': ' + r.spec['what'] if r.spec['what'] else '')
            subjects.setdefault(key, []).append(r)
        for key, rs in subjects.items():
            print('  [%s] %d run%s: %s' % (key, len(rs), 's' if len(rs) > 1 else '', first_line(rs[0])))
            for r in rs:
                print('    exit %d, %.1f s, %.0f MiB: %s' % (r.rc, r.secs, r.rss_mb, cmdline(r)))
    slowest = max(results, key=lambda r: r.secs) if results else None
    fattest = max(results, key=lambda r: r.rss_mb) if results else None
    print('\nsweep: %d runs in %.0f s%s' % (len(results), wall,
          ' (slowest %.1f s: %s; largest %.0f MiB: %s)' % (slowest.secs, cmdline(slowest), fattest.rss_mb,
                                                             cmdline(fattest)) if results else ''))
    print('sweep: ' + ', '.join('%s %d' % (k, sum(1 for r in bad if k in r.problems)) for k in KINDS))
    if bad:
        print('sweep: FAILED: %d of %d runs went wrong%s' % (len(bad), len(results),
              ' (their files are in %s)' % d if a.keep else ' (--keep keeps the files they read under /tmp)'))
        return 1
    print('sweep: ok')
    return 0


if __name__ == '__main__':
    sys.exit(main())
