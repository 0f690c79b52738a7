"""Fixtures for the finetune tests: a miniature GLUE directory that mimics each official file format."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _tiny import tiny_bert_kwargs


def write_tsv(path: Path, rows: list[list[str]], bom: bool = False) -> Path:
    """Write rows as an unquoted TSV (the GLUE convention: a '"' is text), optionally with a UTF-8 BOM."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join("\t".join(row) + "\n" for row in rows)
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + text.encode("utf-8"))
    return path


MNLI_COLUMNS = [
    "index",
    "promptID",
    "pairID",
    "genre",
    "sentence1_binary_parse",
    "sentence2_binary_parse",
    "sentence1_parse",
    "sentence2_parse",
    "sentence1",
    "sentence2",
]
STSB_COLUMNS = ["index", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1", "sentence2"]
MRPC_TEXT = ["#1 ID", "#2 ID", "#1 String", "#2 String"]


def _mnli_row(i: int, s1: str, s2: str) -> list[str]:
    return [str(i), "31193", f"{i}n", "government", "( ( x ) )", "( y )", "(ROOT (S x))", "(ROOT (S y))", s1, s2]


def make_glue_dir(root: Path) -> Path:
    """A GLUE directory with every task, in the formats of GLUE's download script, a few rows each."""
    # CoLA: train/dev without header (source, label, label_notes, sentence); test with header.
    write_tsv(
        root / "CoLA/train.tsv",
        [
            ["gj04", "1", "", "Our friends won't buy this analysis, let alone the next one."],
            ["gj04", "0", "*", "They drank the pub."],
            ["gj04", "1", "", 'He said "hello" and left.'],
            ["bc01", "0", "*", "The more we study verbs, the crazier they get get."],
        ],
    )
    write_tsv(
        root / "CoLA/dev.tsv",
        [
            ["gj04", "1", "", "The sailors rode the breeze clear of the rocks."],
            ["gj04", "0", "*", "The weights made the rope stretch over the pulley over."],
            ["clc95", "1", "", "Bill whistled past the house."],
        ],
    )
    write_tsv(
        root / "CoLA/test.tsv",
        [["index", "sentence"], ["0", "Bill whistled past the house."], ["1", "The car honked its way down the road."]],
    )
    # SST-2
    write_tsv(
        root / "SST-2/train.tsv",
        [
            ["sentence", "label"],
            ["hide new secretions from the parental units ", "0"],
            ["contains no wit , only labored gags ", "0"],
            ['that loves its " characters "', "1"],
        ],
    )
    write_tsv(
        root / "SST-2/dev.tsv",
        [
            ["sentence", "label"],
            ["it 's a charming and often affecting journey . ", "1"],
            ["unflinchingly bleak and desperate ", "0"],
        ],
    )
    write_tsv(
        root / "SST-2/test.tsv",
        [
            ["index", "sentence"],
            ["0", "uneasy mishmash of styles and genres ."],
            [
                "1",
                "this film 's relationship to actual tension is the same as what christmas-tree flocking in a spray "
                "can is to actual snow",
            ],
        ],
    )
    # MRPC: BOM, quotes inside fields (unbalanced: a quoting reader would swallow lines).
    write_tsv(
        root / "MRPC/train.tsv",
        [
            ["Quality", *MRPC_TEXT],
            [
                "1",
                "702876",
                "702977",
                'Amrozi accused his brother , whom he called " the witness " , of deliberately distorting his '
                "evidence .",
                'Referring to him as only " the witness " , Amrozi accused his brother .',
            ],
            [
                "0",
                "2108705",
                "2108831",
                "Yucaipa owned Dominick 's before selling the chain to Safeway in 1998 for $ 2.5 billion .",
                "\" Yucaipa bought Dominick 's in 1995 for $ 693 million .",
            ],
            [
                "1",
                "1330381",
                "1330521",
                "They had published an advertisement on the Internet .",
                "On June 10 , the ship 's owners had published an advertisement .",
            ],
        ],
        bom=True,
    )
    write_tsv(
        root / "MRPC/dev.tsv",
        [
            ["Quality", *MRPC_TEXT],
            ["1", "1355540", "1355592", 'He said " foodservice " pie .', "The foodservice pie business ."],
            [
                "0",
                "2029631",
                "2029565",
                "Magnarelli said Racicot hated the Iraqi regime .",
                'His wife said he was " 100 percent behind George Bush " .',
            ],
        ],
        bom=True,
    )
    write_tsv(
        root / "MRPC/test.tsv",
        [
            ["index", *MRPC_TEXT],
            [
                "0",
                "1089874",
                "1089925",
                "PCCW 's chief operating officer will report .",
                "Current Chief Operating Officer will report .",
            ],
            [
                "1",
                "3019446",
                "3019327",
                'The world \'s two largest " automakers " said .',
                "Domestic sales at both GM and No. 2 Ford Motor Co. declined .",
            ],
        ],
    )
    # QQP: id columns; test has id, question1, question2.
    qqp = ["id", "qid1", "qid2", "question1", "question2", "is_duplicate"]
    write_tsv(
        root / "QQP/train.tsv",
        [
            qqp,
            [
                "133273",
                "213221",
                "213222",
                "How is the life of a math student?",
                "Which level of prepration is enough?",
                "0",
            ],
            [
                "402555",
                "536040",
                "536041",
                "How do I control my horny emotions?",
                "How do you control your horniness?",
                "1",
            ],
        ],
    )
    write_tsv(
        root / "QQP/dev.tsv",
        [qqp, ["1", "3", "4", 'What is a "bot"?', "What's a bot?", "1"], ["2", "5", "6", "Why?", "How?", "0"]],
    )
    write_tsv(
        root / "QQP/test.tsv",
        [
            ["id", "question1", "question2"],
            ["0", "Why am I mentally very lonely?", "Find the remainder when 23^24 is divided by 24"],
        ],
    )
    # STS-B: float scores, quotes inside fields.
    write_tsv(
        root / "STS-B/train.tsv",
        [
            [*STSB_COLUMNS, "score"],
            [
                "0",
                "main-captions",
                "MSRvid",
                "2012test",
                "0001",
                "none",
                "none",
                "A plane is taking off.",
                "An air plane is taking off.",
                "5.000",
            ],
            [
                "1",
                "main-news",
                "headlines",
                "2013",
                "0002",
                "none",
                "none",
                'He said " yes " .',
                "He said no.",
                "0.750",
            ],
            [
                "2",
                "main-forums",
                "deft-forum",
                "2014",
                "0003",
                "none",
                "none",
                "A man is playing a flute.",
                "A man is playing a bamboo flute.",
                "3.800",
            ],
        ],
    )
    write_tsv(
        root / "STS-B/dev.tsv",
        [
            [*STSB_COLUMNS, "score"],
            [
                "0",
                "main-captions",
                "MSRvid",
                "2012test",
                "0000",
                "none",
                "none",
                "A man with a hard hat is dancing.",
                "A man wearing a hard hat is dancing.",
                "5.000",
            ],
            [
                "1",
                "main-captions",
                "MSRvid",
                "2012test",
                "0002",
                "none",
                "none",
                "A young child is riding a horse.",
                "A child is riding a horse.",
                "4.750",
            ],
        ],
    )
    write_tsv(
        root / "STS-B/test.tsv",
        [
            STSB_COLUMNS,
            [
                "0",
                "main-captions",
                "MSRvid",
                "2012test",
                "0024",
                "none",
                "none",
                "A girl is styling her hair.",
                "A girl is brushing her hair.",
            ],
            [
                "1",
                "main-captions",
                "MSRvid",
                "2012test",
                "0033",
                "none",
                "none",
                "A group of men play soccer on the beach.",
                "A group of boys are playing soccer on the beach.",
            ],
        ],
    )
    # MNLI: string gold labels; dev has label1..label5.
    write_tsv(
        root / "MNLI/train.tsv",
        [
            [*MNLI_COLUMNS, "label1", "gold_label"],
            [
                *_mnli_row(
                    0,
                    "Conceptually cream skimming has two basic dimensions.",
                    "Product and geography are what make cream skimming work.",
                ),
                "neutral",
                "neutral",
            ],
            [
                *_mnli_row(1, "you know during the season and i guess", "You lose the things to the following level."),
                "entailment",
                "entailment",
            ],
            [
                *_mnli_row(
                    2,
                    "One of our number will carry out your instructions.",
                    "A member of my team will execute your orders.",
                ),
                "contradiction",
                "contradiction",
            ],
        ],
    )
    dev_cols = [*MNLI_COLUMNS, "label1", "label2", "label3", "label4", "label5", "gold_label"]
    for name in ("dev_matched", "dev_mismatched"):
        write_tsv(
            root / f"MNLI/{name}.tsv",
            [
                dev_cols,
                [
                    *_mnli_row(0, "The new rights are nice enough", "Everyone really likes the newest benefits "),
                    "neutral",
                    "entailment",
                    "neutral",
                    "neutral",
                    "neutral",
                    "neutral",
                ],
                [
                    *_mnli_row(
                        1,
                        'This site includes a " list " of all award winners.',
                        "The Government Executive articles are not available.",
                    ),
                    "contradiction",
                    "contradiction",
                    "contradiction",
                    "contradiction",
                    "contradiction",
                    "contradiction",
                ],
            ],
        )
    write_tsv(
        root / "MNLI/test_matched.tsv",
        [
            MNLI_COLUMNS,
            _mnli_row(
                0,
                "Hierbas, ans seco, ans dulce, and frigola are just a few.",
                "Hierbas is a name worth looking out for.",
            ),
        ],
    )
    write_tsv(
        root / "MNLI/test_mismatched.tsv",
        [MNLI_COLUMNS, _mnli_row(0, "What have you decided?", "What are you going to do?"), _mnli_row(7, "x", "y")],
    )
    write_tsv(
        root / "diagnostic/diagnostic.tsv",
        [
            ["index", "sentence1", "sentence2"],
            ["0", "The cat sat on the mat.", "The cat did not sit on the mat."],
            ["1", "The cat did not sit on the mat.", "The cat sat on the mat."],
        ],
    )
    # QNLI / RTE: string labels; WNLI: 0/1 with 1 = entailment.
    write_tsv(
        root / "QNLI/train.tsv",
        [
            ["index", "question", "sentence", "label"],
            [
                "0",
                "When did the third Digimon series begin?",
                "Unlike the two seasons before it, it was darker.",
                "not_entailment",
            ],
            [
                "1",
                "Which missile batteries often have individual launchers?",
                "When MANPADS is operated by specialists, batteries may have several dozen teams.",
                "entailment",
            ],
        ],
    )
    write_tsv(
        root / "QNLI/dev.tsv",
        [
            ["index", "question", "sentence", "label"],
            [
                "0",
                "What came into force after the new constitution?",
                "As of that day, the new constitution came into force.",
                "entailment",
            ],
            ["1", "Why?", "Because.", "not_entailment"],
        ],
    )
    write_tsv(
        root / "QNLI/test.tsv",
        [
            ["index", "question", "sentence"],
            [
                "0",
                "What organization is devoted to Jihad?",
                "For some decades prior to the First Palestine Intifada, the Muslim Brotherhood opposed it.",
            ],
        ],
    )
    for task in ("RTE", "WNLI"):
        positive, negative = ("entailment", "not_entailment") if task == "RTE" else ("1", "0")
        header = ["index", "sentence1", "sentence2", "label"]
        write_tsv(
            root / f"{task}/train.tsv",
            [
                header,
                [
                    "0",
                    "No Weapons of Mass Destruction Found in Iraq Yet.",
                    "Weapons of Mass Destruction Found in Iraq.",
                    negative,
                ],
                [
                    "1",
                    "A place of sorrow, after Pope John Paul II died, became a place of celebration.",
                    "Pope Benedict XVI is the new leader.",
                    positive,
                ],
            ],
        )
        dev_rows = [
            [
                "0",
                "Dana Reeve, the widow of the actor Christopher Reeve, has died.",
                "Christopher Reeve had an accident.",
                negative,
            ]
        ]
        if task == "RTE":
            dev_rows.append(
                [
                    "1",
                    "Yet, we now are discovering that antibiotics are losing their effectiveness.",
                    "Bacteria is winning the war against antibiotics.",
                    positive,
                ]
            )
        write_tsv(root / f"{task}/dev.tsv", [header, *dev_rows])
        test_rows = [
            ["0", "Maude and Dora had seen the trains.", "Horses ran away."],
            ["1", "Mangla was an underground...", "Mangla was a place."],
        ]
        write_tsv(root / f"{task}/test.tsv", [header[:3], *(test_rows if task == "RTE" else test_rows[:1])])
    return root


@pytest.fixture
def glue_dir(tmp_path: Path) -> Path:
    """A miniature GLUE directory (all nine tasks and the diagnostic set) in tmp_path."""
    return make_glue_dir(tmp_path / "glue_data")


WORDS = (
    "the a an cat dog sat on mat it was warm film movie good bad story he said yes no man is playing flute "
    "plane taking off loves its characters charming journey bleak and of to in"
).split()


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory) -> Path:
    """A randomly initialised 2-layer SesameBert (hidden 32) with a tiny WordPiece tokenizer, saved."""
    from transformers import BertTokenizer

    from modeling import SesameBertConfig, SesameBertModel

    path = tmp_path_factory.mktemp("tiny-bert")
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok = BertTokenizer(vocab={w: i for i, w in enumerate(specials + WORDS + [".", ",", "?", "!", "'", '"'])})
    config = SesameBertConfig(**tiny_bert_kwargs(len(tok), 64))
    torch.manual_seed(0)
    SesameBertModel(config).save_pretrained(path)
    tok.save_pretrained(path)
    return path
