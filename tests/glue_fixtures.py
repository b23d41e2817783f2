"""GLUE task folders in each task's exact file layout, a few rows each, as the GLUE benchmark
distributes them (download_glue_data.py; the columns fairseq's preprocess_GLUE_tasks.sh cuts:
QQP 4,5 / label 6; MNLI 9,10 / label 12 (train), 16 (dev); QNLI, RTE 2,3 / 4; MRPC 4,5 / 1;
STS-B 8,9 / 10; SST-2 1 / 2 (test: 2); CoLA 4 / 2 (test: 2), CoLA train/dev without a header).
Written out here, not taken from examples/glue."""

from pathlib import Path
from typing import Dict, List

# task -> file -> rows (the header, where the file has one, is the first row)
# fmt: off
FIXTURES: Dict[str, Dict[str, List[List[str]]]] = {
    "CoLA": {
        "train.tsv": [
            ["gj04", "1", "", "Our friends won't buy this analysis, let alone the next one we propose."],
            ["gj04", "1", "", "One more pseudo generalization and I'm giving up."],
            ["gj04", "0", "*", "They drank the pub."],
            ["gj04", "1", "", "The sailors rode the breeze clear of the rocks."],
        ],
        "dev.tsv": [
            ["gj04", "1", "", "The sailors rode the breeze clear of the rocks."],
            ["gj04", "0", "*", "The more you eat, the most you want."],
            ["cj99", "1", "", "I'll fix you a drink."],
        ],
        "test.tsv": [
            ["index", "sentence"],
            ["0", "Bill whistled past the house."],
            ["1", "The car honked its way down the road."],
        ],
    },
    "SST-2": {
        "train.tsv": [
            ["sentence", "label"],
            ["hide new secretions from the parental units ", "0"],
            ["contains no wit , only labored gags ", "0"],
            ["that loves its characters and communicates something rather beautiful about human nature ", "1"],
        ],
        "dev.tsv": [
            ["sentence", "label"],
            ["it 's a charming and often affecting journey . ", "1"],
            ["unflinchingly bleak and desperate ", "0"],
        ],
        "test.tsv": [
            ["index", "sentence"],
            ["0", "uneasy mishmash of styles and genres ."],
            ["1", "this film 's relationship to actual tension is the same as what christmas-tree flocking in a spray can is to actual snow : a poor -- if durable -- imitation ."],
        ],
    },
    "MRPC": {
        "train.tsv": [
            ["\ufeffQuality", "#1 ID", "#2 ID", "#1 String", "#2 String"],
            ["1", "702876", "702977", 'Amrozi accused his brother , whom he called " the witness " , of deliberately distorting his evidence .', 'Referring to him as only " the witness " , Amrozi accused his brother of deliberately distorting his evidence .'],
            ["0", "2108705", "2108831", "Yucaipa owned Dominick 's before selling the chain to Safeway in 1998 for $ 2.5 billion .", "Yucaipa bought Dominick 's in 1995 for $ 693 million and sold it to Safeway for $ 1.8 billion in 1998 ."],
        ],
        "dev.tsv": [
            ["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"],
            ["1", "1355540", "1355592", "He said the foodservice pie business doesn 't fit the company 's long-term growth strategy .", '" The foodservice pie business does not fit our long-term growth strategy .'],
            ["0", "2029631", "2029565", "Magnarelli said Racicot hated the Iraqi regime and looked forward to using his long years of training in the war .", "His wife said he was \" 100 percent behind George Bush \" and looked forward to using his years of training in the war ."],
        ],
        "test.tsv": [
            ["index", "#1 ID", "#2 ID", "#1 String", "#2 String"],
            ["0", "1089874", "1089925", "PCCW 's chief operating officer , Mike Butcher , and Alex Arena , the chief financial officer , will report directly to Mr So .", "Current Chief Operating Officer Mike Butcher and Group Chief Financial Officer Alex Arena will report to So ."],
            ["1", "3019446", "3019327", "The world 's two largest automakers said their U.S. sales declined more than predicted last month as a late summer sales frenzy caused more of an industry backlash than expected .", "Domestic sales at both GM and No. 2 Ford Motor Co. declined more than predicted as a late summer sales frenzy prompted a larger-than-expected industry backlash ."],
        ],
    },
    "STS-B": {
        "train.tsv": [
            ["index", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1", "sentence2", "score"],
            ["0", "main-captions", "MSRvid", "2012test", "0001", "none", "none", "A plane is taking off.", "An air plane is taking off.", "5.000"],
            ["1", "main-captions", "MSRvid", "2012test", "0004", "none", "none", "A man is playing a large flute.", "A man is playing a flute.", "3.800"],
            ["2", "main-captions", "MSRvid", "2012test", "0005", "none", "none", "A man is spreading shreded cheese on a pizza.", "A man is spreading shredded cheese on an uncooked pizza.", "3.800"],
            ["3", "main-captions", "MSRvid", "2012test", "0006", "none", "none", "Three men are playing chess.", "Two men are playing chess.", "2.600"],
        ],
        "dev.tsv": [
            ["index", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1", "sentence2", "score"],
            ["0", "main-captions", "MSRvid", "2012test", "0000", "none", "none", "A man with a hard hat is dancing.", "A man wearing a hard hat is dancing.", "5.000"],
            ["1", "main-captions", "MSRvid", "2012test", "0002", "none", "none", "A young child is riding a horse.", "A child is riding a horse.", "4.750"],
            ["2", "main-captions", "MSRvid", "2012test", "0003", "none", "none", "A man is feeding a mouse to a snake.", "The man is feeding a mouse to the snake.", "5.000"],
            ["3", "main-captions", "MSRvid", "2012test", "0007", "none", "none", "A woman is playing the guitar.", "A man is playing guitar.", "2.400"],
        ],
        "test.tsv": [
            ["index", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1", "sentence2"],
            ["0", "main-captions", "MSRvid", "2012test", "0024", "none", "none", "A girl is styling her hair.", "A girl is brushing her hair."],
            ["1", "main-captions", "MSRvid", "2012test", "0033", "none", "none", "A group of men play soccer on the beach.", "A group of boys are playing soccer on the beach."],
        ],
    },
    "QQP": {
        "train.tsv": [
            ["id", "qid1", "qid2", "question1", "question2", "is_duplicate"],
            ["133273", "213221", "213222", "How is the life of a math student? Could you describe your own experiences?", "Which level of prepration is enough for the exam jlpt5?", "0"],
            ["402555", "536040", "536041", "How do I control my horny emotions?", "How do you control your horniness?", "1"],
            ["360472", "364011", "490273", "What causes stool color to change to yellow?", "What can cause stool to come out as little balls?", "0"],
        ],
        "dev.tsv": [
            ["id", "qid1", "qid2", "question1", "question2", "is_duplicate"],
            ["201359", "303345", "303346", "Why are African-Americans so beautiful?", "Why are hispanics so beautiful?", "0"],
            ["263843", "69383", "380476", "I want to pursue PhD in Computer Science about social network,what is the open problem in social networks?", "I handle social media for a non-profit. Should I start going to social media networking events? Are there any good ones in the bay area?", "0"],
        ],
        "test.tsv": [
            ["id", "question1", "question2"],
            ["0", "Would the idea of Trump and Putin in bed together scare you, given the geopolitical implications?", "Do you think that if Donald Trump were elected President, he would be able to restore relations with Putin and Russia as he said he could, based on the rocky relationship Putin had with Obama and Bush?"],
            ["1", "What are the top ten Consumer-to-Consumer E-commerce online?", "What are the top ten Consumer-to-Business E-commerce online?"],
        ],
    },
    "MNLI": {
        "train.tsv": [
            ["index", "promptID", "pairID", "genre", "sentence1_binary_parse", "sentence2_binary_parse", "sentence1_parse", "sentence2_parse", "sentence1", "sentence2", "label1", "gold_label"],
            ["0", "31193", "31193n", "government", "( ( Conceptually ( cream skimming ) ) ... )", "( ( ( Product and ) geography ) ... )", "(ROOT (S ...))", "(ROOT (S ...))", "Conceptually cream skimming has two basic dimensions - product and geography.", "Product and geography are what make cream skimming work. ", "neutral", "neutral"],
            ["1", "101457", "101457e", "telephone", "( you ( ( know ... ) ) )", "( You ( ( lose ... ) ) )", "(ROOT (S ...))", "(ROOT (S ...))", "you know during the season and i guess at at your level uh you lose them to the next level if if they decide to recall the the parent team the Braves decide to call to recall a guy from triple A then a double A guy goes up to replace him and a single A guy goes up to replace him", "You lose the things to the following level if the people recall.", "entailment", "entailment"],
            ["2", "134793", "134793e", "fiction", "( ( One ( of ( our number ) ) ) ... )", "( ( A member ) ... )", "(ROOT (S ...))", "(ROOT (S ...))", "One of our number will carry out your instructions minutely.", "A member of my team will execute your orders with immense precision.", "entailment", "entailment"],
            ["3", "37397", "37397e", "fiction", "( ( How ( do you ) ) ... )", "( ( This information ) ... )", "(ROOT (S ...))", "(ROOT (S ...))", "How do you know? All this is their information again.", "This information belongs to them.", "entailment", "entailment"],
            ["4", "50563", "50563c", "telephone", "( yeah ( i ( ( tell you ) ... ) ) )", "( ( i ( ( do n't ) ... ) ) )", "(ROOT (S ...))", "(ROOT (S ...))", "yeah i tell you what though if you go price some of those tennis shoes i can see why now you know they're getting up in the hundred dollar range", "The tennis shoes have a range of prices.", "neutral", "contradiction"],
        ],
        "dev_matched.tsv": [
            ["index", "promptID", "pairID", "genre", "sentence1_binary_parse", "sentence2_binary_parse", "sentence1_parse", "sentence2_parse", "sentence1", "sentence2", "label1", "label2", "label3", "label4", "label5", "gold_label"],
            ["0", "63735", "63735n", "slate", "( ( The ( new rights ) ) ... )", "( Everyone ( ... ) )", "(ROOT ...)", "(ROOT ...)", "The new rights are nice enough", "Everyone really likes the newest benefits ", "neutral", "entailment", "neutral", "neutral", "neutral", "neutral"],
            ["1", "91383", "91383c", "government", "( ( This site ) ... )", "( ( The ( Government ( Executive articles ) ) ) ... )", "(ROOT ...)", "(ROOT ...)", "This site includes a list of all award winners and a searchable database of Government Executive articles.", "The Government Executive articles housed on the website are not able to be searched.", "contradiction", "contradiction", "contradiction", "contradiction", "contradiction", "contradiction"],
            ["2", "755", "755e", "telephone", "( ( ( ( uh ( i ( ( do n't ) ... ) ) ) ) ) )", "( I ( ( like ... ) ) )", "(ROOT ...)", "(ROOT ...)", "uh i don't know i i have mixed emotions about him uh sometimes i like him but at the same times i love to see somebody beat him", "I like him for the most part, but would still enjoy seeing someone beat him.", "entailment", "entailment", "entailment", "entailment", "entailment", "entailment"],
        ],
        "dev_mismatched.tsv": [
            ["index", "promptID", "pairID", "genre", "sentence1_binary_parse", "sentence2_binary_parse", "sentence1_parse", "sentence2_parse", "sentence1", "sentence2", "label1", "label2", "label3", "label4", "label5", "gold_label"],
            ["0", "75290", "75290c", "letters", "( ( Your contribution ) ... )", "( ( Your contributions ) ... )", "(ROOT ...)", "(ROOT ...)", "Your contribution helped make it possible for us to provide our students with a quality education.", "Your contributions were of no help with our students' education.", "contradiction", "contradiction", "contradiction", "contradiction", "contradiction", "contradiction"],
            ["1", "133794", "133794c", "verbatim", "( ( The answer ) ... )", "( ( The answer ) ... )", "(ROOT ...)", "(ROOT ...)", "The answer has nothing to do with their cause, however, but with the simple fact that dictionaries are not exercises in bi-unique substitutability.", "Dictionaries are indeed exercises in bi-unique substitutability.", "contradiction", "contradiction", "contradiction", "contradiction", "contradiction", "contradiction"],
        ],
        "test_matched.tsv": [
            ["index", "promptID", "pairID", "genre", "sentence1_binary_parse", "sentence2_binary_parse", "sentence1_parse", "sentence2_parse", "sentence1", "sentence2"],
            ["0", "31493", "31493", "travel", "( ( ( ( ( ( ( ( Hierbas , ) ... ) ) ) ) ) ) )", "( ( Hierbas ... ) )", "(ROOT ...)", "(ROOT ...)", "Hierbas, ans seco, ans dulce, and frigola are just a few names worth keeping a look-out for.", "Hierbas is a name worth looking out for."],
            ["1", "92164", "92164", "government", "( ( The ( extent ... ) ) )", "( ( The extent ) ... )", "(ROOT ...)", "(ROOT ...)", "The extent of the behavioral effects would depend in part on the structure of the individual account program and any limits on accessing the funds.", "Many people would be very unhappy to loose control over their own money."],
        ],
        "test_mismatched.tsv": [
            ["index", "promptID", "pairID", "genre", "sentence1_binary_parse", "sentence2_binary_parse", "sentence1_parse", "sentence2_parse", "sentence1", "sentence2"],
            ["0", "2", "2", "letters", "( ( What ... ) )", "( ( What ... ) )", "(ROOT ...)", "(ROOT ...)", "What have you decided, what are you going to do?", "So what's your decision?"],
        ],
    },
    "QNLI": {
        "train.tsv": [
            ["index", "question", "sentence", "label"],
            ["0", "When did the third Digimon series begin?", "Unlike the two seasons before it and most of the seasons that followed, Digimon Tamers takes a darker and more realistic approach to its story featuring Digimon who do not reincarnate after their deaths and more complex character development in the original Japanese.", "not_entailment"],
            ["1", "Which missile batteries often have individual launchers several kilometres from one another?", "When MANPADS is operated by specialists, batteries may have several dozen teams deploying separately in small sections; self-propelled air defence guns may deploy in pairs.", "not_entailment"],
            ["2", "What two things does Popper argue Tarski's theory involves in an evaluation of truth?", "He bases this interpretation on the fact that examples such as the one described above refer to two things: assertions and the facts to which they refer.", "entailment"],
        ],
        "dev.tsv": [
            ["index", "question", "sentence", "label"],
            ["0", "What came into force after the new constitution was herald?", "As of that day, the new constitution heralding the Second Republic came into force.", "entailment"],
            ["1", "What is the first major city in the stream of the Rhine?", "The most important tributaries in this area are the Ill below of Strasbourg, the Neckar in Mannheim and the Main across from Mainz.", "not_entailment"],
        ],
        "test.tsv": [
            ["index", "question", "sentence"],
            ["0", "What organization is devoted to Jihad against Israel?", "For some decades prior to the First Palestine Intifada in 1987, the Muslim Brotherhood in Palestine took a \"quiescent\" stance towards Israel, focusing on preaching, education and social services, and benefiting from Israel's \"indulgence\" to build up a network of mosques and charitable organizations."],
        ],
    },
    "RTE": {
        "train.tsv": [
            ["index", "sentence1", "sentence2", "label"],
            ["0", "No Weapons of Mass Destruction Found in Iraq Yet.", "Weapons of Mass Destruction Found in Iraq.", "not_entailment"],
            ["1", "A place of sorrow, after Pope John Paul II died, became a place of celebration, as Roman Catholic faithful gathered in downtown Chicago to mark the installation of new Pope Benedict XVI.", "Pope Benedict XVI is the new leader of the Roman Catholic Church.", "entailment"],
        ],
        "dev.tsv": [
            ["index", "sentence1", "sentence2", "label"],
            ["0", "Dana Reeve, the widow of the actor Christopher Reeve, has died of lung cancer at age 44, according to the Christopher Reeve Foundation.", "Christopher Reeve had an accident.", "not_entailment"],
            ["1", "Yet, we now are discovering that antibiotics are losing their effectiveness against illness.", "Bacteria is winning the war against antibiotics.", "entailment"],
        ],
        "test.tsv": [
            ["index", "sentence1", "sentence2"],
            ["0", "Mangla was summoned after Madhumita's sister Nidhi Shukla, who was the first witness in the case, could not be produced in the court.", "Shukla is related to Mangla."],
        ],
    },
    "WNLI": {
        "train.tsv": [
            ["index", "sentence1", "sentence2", "label"],
            ["0", "I stuck a pin through a carrot. When I pulled the pin out, it had a hole.", "The carrot had a hole.", "1"],
            ["1", "John couldn't see the stage with Billy in front of him because he is so short.", "John is so short.", "1"],
            ["2", "The police arrested all of the gang members. They were trying to stop the drug trade in the neighborhood.", "The police were trying to stop the drug trade in the neighborhood.", "1"],
            ["3", "Steve follows Fred's example in everything. He influences him hugely.", "Steve influences him hugely.", "0"],
        ],
        "dev.tsv": [
            ["index", "sentence1", "sentence2", "label"],
            ["0", "The drain is clogged with hair. It has to be cleaned.", "The hair has to be cleaned.", "0"],
            ["1", "Jane knocked on Susan's door but she did not answer.", "Susan did not answer.", "1"],
        ],
        "test.tsv": [
            ["index", "sentence1", "sentence2"],
            ["0", "Maude and Dora had seen the trains rushing across the prairie, with long, rolling puffs of black smoke streaming back from the engine. Their roars and their wild, clear whistles could be heard from far away. Horses ran away when they came in sight.", "Horses ran away when Maude and Dora came in sight."],
        ],
    },
}

# fmt: on

# GLUE's diagnostic set (AX), next to the task folders
DIAGNOSTIC = [
    ["index", "sentence1", "sentence2"],
    ["0", "The cat sat on the mat.", "The cat did not sit on the mat."],
    ["1", "The cat did not sit on the mat.", "The cat sat on the mat."],
    [
        "2",
        "When you've got no snow, it's really hard to learn a snow sport so we looked at all the different ways I could mimic being on snow without actually being on snow.",
        "When you've got snow, it's really hard to learn a snow sport so we looked at all the different ways I could mimic being on snow without actually being on snow.",
    ],
]

# the inputs, labels and GLUE indices each task's files hold (what split must produce), per
# fairseq subset: (input columns as 0-based indices, label column or None, index column or None)
COLUMNS = {
    "CoLA": {"train": ((3,), 1, None), "dev": ((3,), 1, None), "test": ((1,), None, 0)},
    "SST-2": {"train": ((0,), 1, None), "dev": ((0,), 1, None), "test": ((1,), None, 0)},
    "MRPC": {"train": ((3, 4), 0, None), "dev": ((3, 4), 0, None), "test": ((3, 4), None, 0)},
    "STS-B": {"train": ((7, 8), 9, None), "dev": ((7, 8), 9, None), "test": ((7, 8), None, 0)},
    "QQP": {"train": ((3, 4), 5, None), "dev": ((3, 4), 5, None), "test": ((1, 2), None, 0)},
    "MNLI": {"train": ((8, 9), 11, None), "dev_matched": ((8, 9), 15, None),
             "dev_mismatched": ((8, 9), 15, None), "test_matched": ((8, 9), None, 0),
             "test_mismatched": ((8, 9), None, 0)},
    "QNLI": {"train": ((1, 2), 3, None), "dev": ((1, 2), 3, None), "test": ((1, 2), None, 0)},
    "RTE": {"train": ((1, 2), 3, None), "dev": ((1, 2), 3, None), "test": ((1, 2), None, 0)},
    "WNLI": {"train": ((1, 2), 3, None), "dev": ((1, 2), 3, None), "test": ((1, 2), None, 0)},
}  # fmt: skip
# GLUE file -> fairseq subset in the data-bin
SUBSET = {"train": "train", "dev": "valid", "test": "test", "dev_matched": "valid",
          "dev_mismatched": "valid1", "test_matched": "test", "test_mismatched": "test1"}  # fmt: skip


def write_tsv(path: Path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join("\t".join(row) + "\n" for row in rows), encoding="utf-8")


def write_glue(root: Path, tasks=None) -> Path:
    """GLUE_DIR/TASK/*.tsv for the tasks (all by default) and GLUE_DIR/diagnostic/diagnostic.tsv."""
    for task, files in FIXTURES.items():
        if tasks is None or task in tasks:
            for name, rows in files.items():
                write_tsv(root / task / name, rows)
    write_tsv(root / "diagnostic" / "diagnostic.tsv", DIAGNOSTIC)
    return root
