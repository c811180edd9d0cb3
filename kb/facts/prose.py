"""Prose mentions in English and Chinese ("使用qwen2、fp16", "bf16 and fp32 is correct", "acc为nan", "output is
filled with exclamation marks") -> facts, and facts derived from other facts (prompt fills max_length …)."""

from __future__ import annotations

import bisect
import re

from kb.canonical import (
    ALGORITHMS,
    CONTRAST,
    DTYPE_OF_WORD,
    DTYPE_WORD,
    FIX_CUE,
    FRAMEWORKS,
    GPU_WITHOUT_BF16,
    HUGE_VALUE,
    LIGHTNING_PRECISION,
    MODEL_FAMILIES,
    NAMES_THAT_ARE_WORDS,
    SAID_FINE,
    SUPPOSED,
    SWITCH_OFF,
    WENT_BAD,
    WORKED_AFTER,
    is_grad_norm,
    is_limit_name,
    is_loss_like,
    said_as_fix,
)
from kb.facts.model import Facts
from kb.facts.prefilter import Haystack, fold

# A clause that reports a dtype as working is the fix, not the failing run.
_GOOD = re.compile(r"\b(?:correct|works?|worked|working|fine(?![- _]?tun)|ok|okay|normal|solved|fix(?:es|ed)?|no (?:nan|problem)|"
                   r"is good|succeed\w*|stable|instead|try|should)\b|正常|没问题|不会有问题|可以|解决|work了|好了|试试|"
                   r"\b(?:did not|didn'?t|does not|doesn'?t) (?:encounter|have|hit|see|show|run into) (?:any |the |this )?"
                   r"(?:issues?|problems?|nans?)\b|"
                   r"换成|改成|调整到|改为", re.IGNORECASE)
_INFERENCE = re.compile(r"inference|推理|generat(?:e|ion) only", re.IGNORECASE)
_MODEL_HALF = re.compile(r"model\s+(?:(?:is|was|being)\s+)?(?:(?:run|held|kept|stored)\s+)?(?:in|to|with|as)\s+"
                         r"(?:fp16|float16|half)|(?:fp16|float16|half)[- ](?:precision )?"
                         r"(?:model|weights)|(?:load\w*|cast\w*)\s+(?:the )?(?:\w+\s+)?(?:model|weights|checkpoint)\s+(?:weights\s+)?"
                         r"(?:in|to|as)\s+(?:fp16|float16|half)|(?:model|weights)\s+(?:(?:were|was|are|is)\s+)?(?:loaded|cast)"
                         r"\s+(?:in|to|as)\s+(?:fp16|float16|half)|模型.{0,6}(?:fp16|半精度|float16)|\.half\(\)", re.IGNORECASE)
_SETTING_AFTER = re.compile(r"[\"']?\s*[:=]")
_SETTING_BEFORE = re.compile(r"(?:--|[=.\"'])$")
_CLAUSE = re.compile(r"[^.。;；!?！？\n]+(?:[.。;；!?！？]|$)")
_SP = re.compile(r"sequence[ _-]parallel|序列并行|(?<![A-Za-z])ring[ _-]?(?:attn|attention)|ulysses|context[ _-]parallel|"
                 # described without its name: "each sample is split across GPUs", "一条样本被切分到多张卡上"
                 # (one sample cut into pieces; "samples are split between ranks" is data parallelism)
                 r"\b(?:each|a|one|every|the|a single)\s+(?:sample|sequence)\s+(?:is\s+|gets\s+)?(?:split|sharded|partitioned)"
                 r"\s+(?:across|over|between|among)\s+(?:the\s+)?(?:gpus|ranks|devices|cards)|"
                 r"(?:一条|每条|单条|每个|一个)(?:样本|序列)(?:被)?(?:切分|拆分|切)(?:到|在)(?:多张?卡|多个\s*gpu|多个?\s*rank|"
                 r"各个?\s*rank|不同的?卡)", re.IGNORECASE)
# ASCII edges throughout ("用zero2训练"), and LLaMA-Factory's shorthand: "设置z2", "z3 offload".
_ZERO = re.compile(r"(?<![A-Za-z0-9_])zero[ _-]?(?:stage[ _-]?)?([123])(?![A-Za-z0-9_])|(?<![A-Za-z0-9_])ds_z([123])|"
                   r"(?<![A-Za-z0-9_])stage[ _-]?([123])(?![A-Za-z0-9_])|(?<![A-Za-z0-9_.\-/])z([123])(?![A-Za-z0-9_.\-/])",
                   re.IGNORECASE)
_ATTN = (
    # not when the name is a switch set off or left to the default (`--flash_attn False`, `flash_attn: auto`)
    (re.compile(r"(?:flash[ _-]?attn|flash[ _-]?attention|\bfa2\b)(?:_?2)?"
                r"(?![ \t]*[:=]?[ \t]*[\"']?(?:" + "|".join((*SWITCH_OFF, "disabled")) + r")\b)"
                # `flash-attn==2.5.8`, `flash-attn   2.3.3   pypi_0`, `- flash_attn version: 2.5.8`: installed, not used
                r"(?![ \t]*(?:version)?[ \t]*(?:==|>=|~=|:)?[ \t]*v?\d+\.\d)", re.IGNORECASE),
     "flash_attention_2"),
    (re.compile(r"(?<![A-Za-z0-9_])sdpa(?![A-Za-z0-9_])|scaled_dot_product_attention", re.IGNORECASE), "sdpa"),
    (re.compile(r"(?<![A-Za-z0-9_])eager attention|attn_implementation\W+eager", re.IGNORECASE), "eager"),
)
_COLLAPSE = re.compile(r"[!！]{4,}|exclamation mark|感叹号|全(?:部)?(?:变)?(?:为|是|成)\s*[“\"「『'‘]?\s*[!！]|"
                       r"(?:token|output|generated|predicted)[ _]?ids? (?:is |are |all )*0\b|"
                       r"乱码|gibberish|garbage output|repeat(?:s|ed|ing)? the same token", re.IGNORECASE)
# verl's `low_var_kl` (Schulman's k3): exp(ref - logp) overflows when the policy drifts; named in prose and code.
_KL_K3 = re.compile(r"low[_ ]var[_ ]kl|\bk3\b(?:[ _-]?(?:kl|estimator))|kl[ _-]?estimator\W{0,3}k3", re.IGNORECASE)
# The KL term used as a loss, said in words: "开启 kl loss", "with the KL loss enabled", "use_kl_loss on" (said off:
# "without the kl loss", "关闭 kl loss"). A logged `kl_loss` metric alone is not read here: it names a value.
_KL_LOSS = re.compile(r"(?:开启|启用|打开|使用|用了?|加上|加入|\benabl(?:e[sd]?|ing)|\bwith|\busing|\buses?|\bturn(?:ed|s)? on|"
                      r"\badd(?:ed|ing|s)?)\s{0,2}(?:the |a )?(?:use_)?kl[ _-]?(?:loss|损失)(?![\w/])|"
                      r"(?<![\w/])(?:use_)?kl[ _-]?(?:loss|损失)\s{0,2}(?:is |was )?(?:enabled|turned on|on\b|开启|打开)|"
                      r"use_kl_loss\s*(?:=|:|：)?\s*true", re.IGNORECASE)
_LENGTH_NORM = re.compile(r"length[- ]normali[sz]\w*|average[_ ]log[_ ]?probs?|average_logps|长度归一", re.IGNORECASE)
# A metric's name: a metric word, alone or as the last word of a compound (`crossentropyloss`, `gradnorm`), with
# `_` / `/` parts around it (`actor/grad_norm`, `rewards/chosen`, `kl_coef`); a whole word, so that "quickly",
# "normal", "apply" and "accelerate" (which hold kl, norm, ppl and acc) are none.
_METRIC_NAME = (r"(?:(?:[A-Za-z]+[_/])*(?:[A-Za-z]*(?:loss|norm)(?:es|s)?|kld?|acc|accuracy|rewards?|logps|logits|"
                r"margins?|x?entropy|ppl|nll)\d*(?:[_/][A-Za-z0-9]+)*(?![A-Za-z0-9]))")
_BAD_VALUE = r"(?:(?i:nans?|inf|infinity)|无穷大?|0(?:\.0+)?(?!\d|\.\d)|zero|零(?![点.]))"  # "kl变为Nan" too
_PROSE_METRIC = re.compile(r"(?<![A-Za-z0-9_/])(?P<m>" + _METRIC_NAME + r")(?=(?P<gap>[^\n,，。.;；=]{0,30}?)"
                           r"(?<![A-Za-z0-9_.])(?P<v>" + _BAD_VALUE + r")(?![A-Za-z0-9_]))", re.IGNORECASE)
# The same with a metric named in Chinese: "损失变成 nan", "梯度范数一直为 0", "验证集上的损失为 nan", "奖励变为 nan"
# (`_ZH_METRIC` gives each its canonical name; a word before "损失" that names evaluation makes it eval_loss).
_PROSE_METRIC_ZH = re.compile(r"(?P<m>梯度范数|梯度模长|梯度|损失值?|损失函数值?|奖励值?|KL\s*散度)(?=(?P<gap>[^\n,，。.;；=]{0,30}?)"
                              r"(?<![A-Za-z0-9_.])(?P<v>" + _BAD_VALUE + r")(?![A-Za-z0-9_]))", re.IGNORECASE)
# The metric's sentence goes on in a second clause with no subject of its own: "loss先在2左右上下波动，然后突然变成0",
# "Loss突然增大，然后变为0", "the loss decreases normally, then suddenly becomes nan". The second clause must start
# with its "then" and go straight to the value (another metric or a negation there is no such clause).
_PROSE_METRIC_THEN = re.compile(
    r"(?<![A-Za-z0-9_/])(?P<m>" + _METRIC_NAME + r"|损失|梯度范数)(?P<gap>[^\n,，。.;；]{0,40}?)[，,][ \t]{0,3}"
    r"(?:然后|随后|之后|后来|最后|最终|接着|但是?|可是|却|and then|but then|then|but)[ \t]{0,3}(?:突然|很快|迅速|直接|就|又|(?:suddenly|quickly|"
    r"immediately|eventually)[ \t]{1,3})?(?:变成了?|变为|降至|降到|降为|掉到|跌到|归|为|(?:goes|went|drops?|dropped|falls?|"
    r"fell)[ \t]{1,3}to[ \t]{1,3}|becomes?[ \t]{1,3}|became[ \t]{1,3}|turn(?:s|ed)?[ \t]{1,3}(?:in)?to[ \t]{1,3})[ \t]{0,3}"
    r"(?P<v>" + _BAD_VALUE + r")(?![A-Za-z0-9_.])", re.IGNORECASE)
_ZH_METRIC = (("梯度", "grad_norm"), ("损失", "loss"), ("奖励", "reward"), ("kl", "kl"))
_PROSE_METRIC_REV = re.compile(r"(?<![A-Za-z0-9_])(?P<v>nan|NaN|inf|Inf)(?:s|['’]s)?\b['\"`”’]{0,3}\s*(?:values?\s*)?(?:in|for|of|on)\s+"
                               r"(?:(?:the|both|local|global|total)\s+)*(?:grad(?:ient)?\s+(?=norm))?"
                               r"(?:(?:validation|evaluation|eval|val|training|train|test)\s+(?=loss))?"
                               r"(?P<m>" + _METRIC_NAME + r")", re.IGNORECASE)
# The bad value as the metric's adjective: "reports NaN eval loss on every rank", "produces NaN training loss",
# "a NaN gradient norm" (the word before the metric still names the evaluation loss, _EVAL_BEFORE).
_PROSE_METRIC_ADJ = re.compile(r"(?<![A-Za-z0-9_-])(?P<v>nan|inf)['\"`”’]?\s+(?:(?:eval(?:uation)?|validation|val|test|training|train)"
                               r"[ _])?(?P<m>loss(?:es)?|grad(?:ient)?[ _]norms?|kl|grad(?:ient)?s?(?!\w|\s*(?:checkpoint|accum|clip)))\b",
                               re.IGNORECASE)  # "NaN gradients": recorded as `gradients`
# "There are NaNs in the gradients", "the gradients become nan": recorded as the metric `gradients`, apart from a
# logged grad_norm that the curated triggers reason about (read as grad_norm, the case base's top-1 fell by a report).
_NAN_GRADS = re.compile(r"(?<![A-Za-z0-9_])(?:nan|inf)s?\s+(?:values?\s+)?(?:in|of)\s+(?:the\s+|all\s+)?(?:\w+\s+)?"
                        r"grad(?:ient)?s\b|(?<![A-Za-z0-9_])grad(?:ient)?s\s+(?:is|are|were|become|became|turn(?:s|ed)?"
                        r"(?:\s+in)?to)\s+(?:all\s+)?(?:nan|inf)\b", re.IGNORECASE)
# `tensor(nan, device='cuda:1', dtype=torch.float16, grad_fn=<NllLossBackward0>)`: a printed loss that is NaN.
_LOSS_TENSOR = re.compile(r"\btensor\([ \t]{0,3}(?P<v>nan|inf)\b[^()\n]{0,200}?grad_fn=<\w{0,40}?Loss\w{0,20}>",
                          re.IGNORECASE)
# "WARN: grad_norm is not finite: nan", "the loss became non-finite": NaN or inf, the words do not say which.
_NOT_FINITE = re.compile(r"(?<![A-Za-z0-9_/])(?P<m>" + _METRIC_NAME + r")\s+(?:is|was|are|were|became|becomes|goes|went)\s+"
                         r"(?:not\s+finite|non-?finite)\b|(?<![A-Za-z0-9_-])non-?finite\s+(?P<m2>loss(?:es)?|grad(?:ient)?[ _]norms?)\b",
                         re.IGNORECASE)
# "loss: 11.20 -> 11.17 -> nan", "loss 2.1 → 8.3 → inf": a trajectory that ends in a bad value.
_TRAJECTORY = re.compile(r"(?<![A-Za-z0-9_/])(?P<m>" + _METRIC_NAME + r")['\"]?\s*[:=：]?\s*(?:[-+]?[\d.]+(?:e[-+]?\d+)?\s*"
                         r"(?:->|→|=>|—>|to|then|,)\s*)+(?P<v>nan|inf|0(?:\.0+)?(?![\d.]))(?![A-Za-z0-9_])", re.IGNORECASE)
_GAP_OK = re.compile(r"^(?:\s*(?:is|was|are|were|becomes?|became|will be|will become|goes?(?: to)?|went(?: to)?|turns? (?:in)?to|turn(?:s|ed)?|"
                     # "the loss stays at 0", "grad_norm is stuck at nan"
                     r"(?:stays?|stayed|remains?|remained|(?:is |was |gets? |got )?stuck|sits?|sat|pinned) at|"
                     r"stays?|remains?|always|keeps?|got|gets|shows?|reports?|of|to|equals?|both|=|:|：|一直|都|总|变|变为|"
                     r"(?:to )?be|"  # "loss always be nan", "the loss seems to be nan"
                     r"(?:came|comes?|turned|turns?) out|"  # "the evaluation loss came out NaN"
                     r"(?:jump(?:s|ed)?|shoots?|shot|spike[sd]?|explode[sd]?|blows? up|blew up)\s+(?:up\s+)?to|"  # "jumps to NaN"
                     r"reach(?:es|ed)?|hits?|"  # "Loss Reaches NaN"
                     r"(?:produc|yield|return|giv)(?:es?|ed|ing|s)|gave|"  # "Distillation loss produces NaNs"
                     r"变成|为|是|出现|会|就|直接|也|and [\w/]+ (?:will be|are|were|become)|一直为|一直是|"
                     r"显示(?:为|是)?|归|持续|"  # "梯度范数(grad_norm)显示为NaN", "Loss值归零", "梯度范数持续显示为NaN"
                     r"全程|始终|全部|全都|全为|全是|均|"
                     r"走到|走向|跑到|到了|"  # "step1 loss直接走到Nan"
                     r"(?:keeps? |kept )?(?:coming|comes?|came) back(?: as)?|"  # "eval loss keeps coming back as `nan`"
                     # "loss 和 grad_norm 一直为 0", "loss、grad_norm 都是 nan", "loss and grad_norm are 0"
                     # "the loss and the grad norm stay at 0": a two-word metric after the conjunction
                     # (the second name in ASCII: "pg_loss和adv/mean接近0" is no "adv/mean接近" at 0)
                     r"(?:和|与|及|跟|、|&|and|as well as)\s*(?:the\s+)?(?:grad(?:ient)?\s+norms?|[A-Za-z_][A-Za-z0-9_/]*)|"
                     # "the training loss and the eval loss are nan"
                     r"(?:and|as well as) the (?:eval\w*|validation|val|train\w*|test) [A-Za-z_][\w/]*|"
                     r"[\w/]+ (?:will be|are|were)))*\s*(?:a |an )?$", re.IGNORECASE)
# Words between a metric and its bad value that say only when or how fast: "loss 突然变成了 nan", "kl 指标变为 NaN",
# "the kl divergence goes to nan", "loss 在第 300 步后变为 nan", "the loss quickly drops to 0". They are removed
# before _GAP_OK judges the rest; a negation or another metric in the gap still rejects it ("loss 没有变成 nan").
_GAP_FILLER = re.compile(
    r"在?从?第\s*(?:\d+|[一二三四五六七八九十两]+)\s*(?:步|个?\s*steps?|轮|个?\s*epochs?)\s*(?:后|之后|以后|时|开始|起)?|"
    r"在?(?:训练)?(?:几|数|一些|若干)\s*(?:步|个?\s*steps?|轮)\s*(?:后|之后|以后)?|"
    r"(?:训练|跑)?(?:了)?(?:一会儿?|一段时间|一阵子?|一段|几个小时)(?:后|之后|以后)?|"  # "loss训练一会后变成nan"
    r"在?(?:约|大约|大概)?[ \t]{0,3}\d{1,7}[ \t]{0,3}(?:步|个?[ \t]{0,3}steps?|轮)[ \t]{0,3}(?:后|之后|以后|时)|"  # "在约114步后突降至0"
    r"\b(?:after|within|in)\s+(?:the\s+)?(?:a few|several|some|\d+|first|one|two|three)\s+(?:\w+\s+)?"
    r"(?:steps?|iterations?|epochs?)\b|"
    r"\b(?:suddenly|quickly|then|eventually|soon|immediately|directly|finally|gradually|rapidly|just|would|divergence|"
    r"consistently|constantly|continuously|persistently|"
    r"already|still|again|also)\b|"
    r"\b(?:term|component|part)\b|"  # "the NLL term turns nan"
    r"\b(?:from start to finish|throughout|all along|the whole time)\b|"  # "loss 从头到尾都是 0.0"
    # how it moved before it broke: "the loss oscillates and then goes nan", "loss 一直震荡甚至变成 nan"
    r"\b(?:oscillat\w*|fluctuat\w*|bounc\w*)(?:\s+(?:for a while|a lot|wildly|heavily))?(?:\s+and)?\b|"
    r"(?:上下)?(?:震荡|波动|抖动)(?:不降|不下降)?|甚至|"
    r"还是|仍然|依然|依旧|照样|仍|突然|很快|迅速|快速|直接|一下子?|马上|立刻|立即|最终|最后|随后|然后|逐渐|慢慢|之后|后来|了|数值|值|指标|曲线|项|部分|开始|"
    r"[（(][ \t]{0,3}[A-Za-z_][\w/ ]{0,30}[)）]|"  # "损失值(loss)突然变为NaN", "梯度范数(grad_norm)也为0": the name again
    r"\bstart(?:s|ed)? (?:to be|being)\b|"  # "loss 开始为 nan", "the loss started being nan"
    r"从头到尾|自始至终|一开始就|从一开始|^[`'\"]|[`'\"“”‘’]\s*$|"  # "eval loss is 'nan'"
    r"在?训练(?:过程)?中|"  # "loss在训练过程中突然降至0"
    # a short aside: "loss在训练过程中（1个epoch之后）突然降至0" (not one that negates: "（并没有）")
    r"[（(](?![^()（）]{0,24}?(?:不|没|\bno\b|\bnot\b))[^()（）\n]{0,24}[)）]",
    re.IGNORECASE)
# "drops to 0", "降到 0": how a loss reaches zero (with _BAD_VALUE's "0" not followed by more digits).
_GAP_FALL = re.compile(r"^\s*(?:就|也|都|会|will|would)?\s*"
                       r"(?:(?:drops?|dropped|falls?|fell|decrease[sd]?|reduce[sd]?|collapse[sd]?)\s+(?:down\s+)?to|"
                       r"(?:突降|骤降|降|掉|跌|减|回落)?(?:到|为|至))\s*$", re.IGNORECASE)


_SECOND_METRIC = re.compile(r"^\s*(?:和|与|及|跟|、|&|and|as well as)\s*(?:the\s+)?(?:grad(?:ient)?\s+norms?|[A-Za-z_][A-Za-z0-9_/]*)",
                            re.IGNORECASE)


def _gap_ok(gap: str) -> bool:
    """True when `gap` (between a metric's name and a bad value in prose) says the metric took that value."""
    if _GAP_OK.match(gap):
        return True
    rest = _GAP_FILLER.sub(" ", gap)
    # "Loss and acc drop to 0": a second metric named before the fall
    return bool(_GAP_OK.match(rest) or _GAP_FALL.match(rest) or _GAP_FALL.match(_SECOND_METRIC.sub("", rest, count=1)))


# "from the first step the loss is nan", "从第一步起 loss 就是 0": the first bad step, said in words (a log's own
# step counter, read earlier, wins). The clause must also name a bad value and not call anything normal.
_FROM_START = re.compile(r"from the (?:very )?(?:first|1st) (?:step|iteration)|(?:from|at|on) step (?:0|1)\b|"
                         r"\bright away\b|(?:immediately|as soon as) (?:as |when |after )?(?:the )?training (?:begins|starts)|"
                         r"\bin the (?:very )?first (?:batch|step|iteration)\b|after the first batch\b|"
                         r"from the (?:very )?(?:start|beginning|outset)\b|(?:从|一)开始(?:训练)?就|开始训练就|从一开始|"
                         r"(?:at|on) the (?:very )?(?:first|1st) (?:step|iteration)|"
                         r"从第\s*(?:一|1|0)\s*(?:步|个\s*step|次迭代)|第\s*(?:一|1|0)\s*(?:步|个\s*step)(?:就|即|起|开始)",
                         re.IGNORECASE)
# "grad_norm is nan at every step", "每一步都是 nan": the first step too, unless the clause says it came later ("then
# loss 0.0 on every step").
_EVERY_STEP = re.compile(r"(?:at|on|in) every (?:single )?(?:step|iteration)|每一步|每个\s*step", re.IGNORECASE)
_LATER = re.compile(r"\b(?:then|after|later|afterwards)\b|之后|然后|后来|以后", re.IGNORECASE)
# "NaN at step 300", "from step 120 on", "第二步开始就是 0": a later first bad step, said in words.
_AT_STEP = re.compile(r"\b(?:(?:at|from|since|starting (?:at|from)|on|after|around|about|comes to|reach(?:es|ed|ing)?) "
                      r"(?:the )?(?:step|iteration|iter)(?: ?= ?| |-)(\d{1,3}(?:,\d{3}){1,2}(?!\d)|\d{1,7})|"
                      r"after (?:about |around |roughly |approximately |~ ?)?(\d{1,3}(?:,\d{3}){1,2}|\d{1,7}) (?:or so )?"
                      r"(?:training )?(?:steps|iterations|iters))\b|"
                      # "after one step", "after the first step", "when training one step", "around 80 iters in"
                      r"\b(?:after|training) (?:(?:the )?(first|1st)|(one|two|three|four|five|ten|1)) (?:training )?"
                      r"(?:steps?|iterations?|iters?)\b|"
                      r"\b(?:around|about|roughly|approximately|~) ?(\d{1,7}) (?:steps|iterations|iters) in\b|"
                      r"\b(?:on|at|in) the (second|third|2nd|3rd) (?:training )?(?:step|iteration)\b|"
                      r"从?第\s*(\d{1,7}|[一二三四五六七八九十两]{1,3})\s*(?:步|个\s*step|次迭代)\s*(?:开始|起|就|时|后|之后|以后|及以后|"
                      r"[,，]?\s*(?=loss|grad|梯度|损失)|"
                      # "loss在第1000步变成nan": the step, then the bad value
                      r"(?=(?:变成|变为|出现|突然|直接|就)?\s*(?:nan|inf|0(?![\d.]))))|"
                      r"(?<![A-Za-z])step\s*(\d{1,7})\s*(?:时|的时候|之后|以后|后)|"
                      r"在\s*(\d{1,7})\s*个?\s*(?:step|步|iter)s?\s*(?:之后|以后|后)|"
                      r"(?:训练|跑)了?\s*(\d{1,7})\s*[多余]?\s*(?:步|个\s*steps?|次迭代)\s*(?:之后|以后|后)|"
                      # "大约 20 多步后 loss 开始为 nan" (not "每 100 步后": a period, not a moment)
                      r"(?<![每\d])(?:大约|大概|约)\s*(\d{1,7})\s*[多余]?\s*(?:步|个\s*steps?|次迭代)\s*(?:之后|以后|后)|"
                      # "训练到 1000 多步时": about that step ("多" / "余": a few more)
                      r"(?:训练|跑)?到\s*第?\s*(\d{1,7})\s*[多余]?\s*(?:步|个?\s*(?:iter|step)s?(?![A-Za-z0-9_])|次迭代)|"
                      # "训练到 step 205 左右出现 nan", "在step205左右nan"
                      r"(?:训练|跑|在)到?\s*(?:step|iter(?:ation)?)\s*(\d{1,7})", re.IGNORECASE)
_EN_STEPS = {"first": 1, "1st": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "ten": 10, "second": 2,
             "2nd": 2, "third": 3, "3rd": 3}
_CN_DIGITS = {"一": 1, "二": 2, "两": 2, "三": 3, "四": 4, "五": 5, "六": 6, "七": 7, "八": 8, "九": 9}


def _step_number(word: str) -> int | None:
    """'12' -> 12, '8,000' -> 8000; '二' -> 2, '十二' -> 12, '二十' -> 20 (the step numbers a sentence writes in
    Chinese)."""
    word = word.replace(",", "").lower()
    if word in _EN_STEPS:
        return _EN_STEPS[word]
    if word.isdigit():
        return int(word)
    if "十" in word:
        tens, _, ones = word.partition("十")
        return (_CN_DIGITS.get(tens, 1) if tens else 1) * 10 + (_CN_DIGITS.get(ones, 0) if ones else 0)
    return _CN_DIGITS.get(word) if len(word) == 1 else None


_BAD_IN_CLAUSE = re.compile(r"(?<![A-Za-z0-9_.])(?:nan|inf)(?![A-Za-z0-9_])|(?:为|是|都是|就是|变成|变为)\s*0(?![\d.])|"
                            r"(?<![A-Za-z0-9_])(?:loss|norm)\s*[:=]?\s*0(?:\.0+)?(?![\d.])|\b(?:is|was|are|were|of|to|becomes?|became)\s+"
                            r"(?:0(?:\.0+)?(?![\d.])|zero\b)", re.IGNORECASE)
_SENTENCE_END = re.compile(r"(?<!\d)\.|\.(?!\d)|[。;；!?！？]")  # not the point of "0.0"
_NORMAL_IN_CLAUSE = re.compile(r"正常|\bnormal(?!i[sz])|\bfine(?![- _]?tun)\b|\bok\b|healthy|没问题", re.IGNORECASE)


# "the loss jumped to 153318", "loss went up to 1.2e+34", "loss 突然变成 1e5": a value no healthy loss or gradient
# norm reaches (HUGE_VALUE, as for log lines), said in words. Counts ("loss of 10000 samples") are not values.
_PROSE_HUGE = re.compile(r"(?<![A-Za-z0-9_/])(?P<m>" + _METRIC_NAME + r")(?P<gap>\s{0,3}(?:(?:suddenly|then|quickly|"
                         r"is|was|becomes?|became|goes|went|got|jump(?:s|ed)?|shoots?|shot|rises?|rose|increase[sd]?|"
                         r"spike[sd]?|climb(?:s|ed)?|explode[sd]?|blows?|blew|reach(?:es|ed)?|hits?|up|to|of|around|about|"
                         r"over|above|as high as|as large as|extremely|very|large|huge|big|\(|（|=|:|：|突然|直接|一下子?|变成|变为|为|是|涨到|升到|飙到|"
                         r"飙升到|暴涨到|上升到|增大到|达到|到了?|约|高达|超过)\s{0,3}){1,5})"
                         r"(?P<v>\d{5,}(?:\.\d+)?|\d+(?:\.\d+)?e\+?\d{1,3})(?![\w.])"
                         r"(?!\s*(?:samples?|steps?|tokens?|examples?|iter\w*|epochs?|rows|lines|条|步|个|次|轮))",
                         re.IGNORECASE)
# "The grad_norm is abnormally large", "grad norm too large", "grad_norm 变得异常大": a gradient norm said in words
# to be far out of range, with no number (a plain "large" or "很大" is not enough: early norms are often large).
_PROSE_LARGE_NORM = re.compile(r"(?<![A-Za-z0-9_/])(?:grad(?:ient)?[_ ]?norms?|梯度范数|梯度的?范数)(?P<gap>[^\n,，。.;；]{0,24}?)"
                               r"(?:(?:abnormally|extremely|insanely|unusually|absurdly|ridiculously|way too|too) "
                               r"(?:large|big|high)\b|(?:huge|enormous|astronomical)\b|异常(?:地)?大|特别大|非常大|极大|过大|"
                               r"巨大|大得离谱)", re.IGNORECASE)
# "首步 loss 高达 500 多", "the training loss starts at 800": a token-averaged training loss
# sits near ln(vocabulary size) (about 12) at worst, so one said in words to be in the hundreds or thousands is a
# symptom too. Only the plain training loss: a value loss or a summed loss can be that large and healthy. "loss 从
# 3000 开始下降" is left alone: 从 … 开始 more often names the step it started at.
_PROSE_HIGH_LOSS = re.compile(r"(?<![A-Za-z0-9_/])(?<!value )(?<!critic )(?<!vf )(?<!aux )(?<!sum )"
                              r"(?:(?:train(?:ing)?[_ ])?loss|损失)(?P<gap>\s{0,3}(?:(?:is|was|of|at|starts? at|"
                              r"started at|around|about|over|above|as high as|reach(?:es|ed)?|"
                              r"=|:|：|就是|就|约|高达|达到|超过|到了?|是|为|变成)\s{0,3}){1,4})"
                              r"(?P<v>[1-9]\d{2,3}(?:\.\d+)?)[多余]?(?![\w.%])(?!\s*(?:samples?|steps?|tokens?|examples?|"
                              r"iter\w*|epochs?|rows|lines|px|条|步|个|次|轮|张|样本))", re.IGNORECASE)
# "normalized advantages of -1,000,000 and +1,000,000", "the odd sample's advantage spikes to about -2000":
# group-normalised advantages are z-scores (a few units at most), so one said to be in the hundreds or beyond means
# a group std near zero. Counts ("advantage of 1000 samples") are not values.
_PROSE_ADVANTAGE = re.compile(r"(?<![A-Za-z0-9_/])(?:normali[sz]ed\s+)?advantages?(?P<gap>[^.。;；\n\d]{0,40}?)"
                              r"(?P<v>[-+±−]?\s?(?:\d{1,3}(?:,\d{3})+|\d{3,}|\d+(?:\.\d+)?e\+?\d{1,3})(?:\.\d+)?)"
                              r"(?![\w.%])(?!\s*(?:samples?|steps?|tokens?|examples?|prompts?|groups?|iter\w*|epochs?|"
                              r"rows|条|步|个|次|轮))", re.IGNORECASE)
# A pairwise (reward-model / preference) loss that cannot separate the pair: "the same score for chosen and rejected",
# "loss stuck at 0.693" (= ln 2, the loss of equal scores). A loss that merely plateaus elsewhere is not. A collapse
# symptom, and the fact `pairwise_tie` that the padding-side cue reads.
_PAIRWISE_TIE = re.compile(r"(?:same|identical|equal) (?:scores?|rewards?|logits?) (?:for|to|on) (?:both )?(?:the )?"
                           r"chosen and (?:the )?rejected|chosen (?:and|和|与) rejected[^.。\n]{0,30}?(?:the same|identical|"
                           r"相同|一样|一致)|loss[^.;。\n]{0,30}?(?:stuck|stays?|stayed|remains?|remained|constant|flat|一直|"
                           r"固定|不变|保持)[^.;。\n]{0,12}?(?:at |在|为)?\s*(?:~|约)?0\.69(?:3\d*)?(?!\d)", re.IGNORECASE)
# An RL run whose trainer and rollout engine disagree on the same tokens' log-probs ("the training-vs-rollout log-prob
# difference stayed very large", "vllm_vs_local_logprob_diff_mean kept rising", "训推 logprob 差异很大"): the policy
# being updated is not the one that sampled, a divergence whatever the loss shows (symptom `rollout_mismatch`).
_ROLLOUT_MISMATCH = re.compile(
    r"(?:log[-_ ]?probs?|logp)\w*[^.;。\n]{0,40}?(?:gap|diff\w*|differen\w*|mismatch\w*|差异|差距|不一致)[^.;。\n]{0,40}?"
    r"(?:large|huge|big|high|grow\w*|ris(?:e|es|ing)\b|rose|increas\w*|climb\w*|explod\w*|很大|变大|增大|越来越大)|训推不一致|"
    # NeMo-RL's token_mult_prob_error, verl's rollout_probs_diff_*: the same mismatch by its metric's name
    r"(?:very |too )?(?:high|large|huge|big)\s+(?:\w+/)?(?:token_mult_prob_error|rollout_probs?_diff\w*)|"
    r"(?:token_mult_prob_error|rollout_probs?_diff\w*)\s+(?:is|was|are|gets?|got|becomes?|became)\s+(?:very |too )?"
    r"(?:high|large|huge|big)",
    re.IGNORECASE)
_SYMPTOM = (
    (re.compile(r"(?<![A-Za-z0-9_])(?:nan|NaN|NANs?|NaNs|Nan)(?![A-Za-z0-9_])"), "nan"),
    # "finite loss, non-finite grad norm", "the total norm ... is non-finite" (not `error_if_nonfinite`)
    (re.compile(r"(?<![\w-])non[- ]finite(?![\w-])|\bnot finite\b", re.IGNORECASE), "nan"),
    (re.compile(r"(?<![A-Za-z0-9_])(?:inf|Inf|infinity)(?![A-Za-z0-9_])|无穷"), "inf"),
    (re.compile(r"loss\W{0,3}(?:一直|都|总)?(?:是|为|变为|变成|=|:)?\s*0(?:\.0+)?(?![\d.])|loss (?:is|becomes|became|will be|"
                r"goes to|drops to|of) (?:0(?!\.?\d)|zero\b)|zero (?:train(?:ing)?[ -])?loss|(?:loss|损失)[^。，,;；\n]{0,12}?(?:为|变为|变成|降为|降到|"
                r"掉到|跌到|归零|全是|全为|都是)\s*0(?![\d.])|(?:loss|损失)[^。，,;；\n]{0,6}归零|"
                # "GKDTrainer reports 0 loss", "gives a 0.0 training loss"
                r"\b(?:reports?|reported|gives?|gave|shows?|showed|logs?|logged|gets?|got|getting|returns?|returned|"
                r"followed by|then)\s+(?:a\s+)?0(?:\.0+)?\s+(?:train(?:ing)?\s+)?loss\b|"  # "inf loss followed by 0.0 loss"
                # a title "[GKD] 0 loss" (not "epoch 0 loss: 2.3", "rank 0 loss nan")
                r"^[ \t]{0,3}(?:\[[^\]\n]{1,30}\][ \t]{0,3}){0,3}0(?:\.0+)? (?:train(?:ing)? )?loss[ \t]*$|"
                # "loss normal at first, then suddenly 0", "loss starts ~7-11, then 0.000000 from step 4"
                r"\bloss\b[^.;。\n]{0,40}?\bthen\s+(?:suddenly\s+|quickly\s+|immediately\s+)?(?:(?:drops?|dropped|goes|went|"
                r"falls?|fell|becomes?|became|collapses?|collapsed)\s+(?:to\s+)?)?(?:0(?:\.0+)?|zero)(?![\w.])",
                re.IGNORECASE), "zero_loss"),
    # Numeric overflow only: "显存溢出" / "memory overflow" is an OOM, not a divergence.
    (re.compile(r"(?<!memory )(?<!stack )(?<!buffer )(?<![A-Za-z_])overflow(?![A-Za-z_])|(?<![A-Za-z_])overflow(?:s|ed|ing)\b|"
                r"(?<!显存)(?<!内存)(?<!缓存)溢出", re.IGNORECASE), "overflow"),
    # A training run that diverges; a process that crashes ("crash", "崩溃") is not a divergence.
    # "策略坍塌" / "奖励塌方" / "训崩了" say collapse in Chinese ("崩溃" alone is a crash).
    # "the KL divergence" names a metric, not a run that diverged ("then KL diverges" is one).
    (re.compile(r"collaps\w+|diverg(?!ences?(?![A-Za-z0-9_]))[A-Za-z]+|(?<!kl )(?<!kl-)(?<!leibler )divergences?(?![A-Za-z0-9_])|"
                r"发散|explod\w+|"
                r"explosions?\b|(?<!显存)爆炸|loss spikes?|梯度爆炸|坍塌|塌方|训(?:练)?崩(?!溃)|"
                r"(?:模型|loss|训练|奖励|reward)\s*(?:直接|彻底)?崩(?:了|掉)|"
                # Chinese slang for a loss that blew up: "loss 飞了", "loss 直接炸了", "梯度爆了" ("显存爆了" is an OOM)
                r"(?:loss|损失|梯度|grad[_ ]?norm)\s*(?:直接|突然|又|就|也)?(?:飞了|飞掉|炸了|炸掉|爆了|爆掉)",
                re.IGNORECASE), "collapse"),
    # A loss or gradient norm said in words to reach tens of thousands: "loss 飙到几万", "grad_norm 上万".
    (re.compile(r"(?:loss|损失|梯度|grad[_ ]?norm)[^。，,;；\n]{0,8}?(?:几万|上万|几十万|上百万|几百万|上亿)", re.IGNORECASE),
     "huge"),
    # A loss or gradient norm that climbs instead of falling: "loss 不降反升", "grad_norm 越来越大", "the gradient
    # norm keeps growing", "abnormally high grad_norm".
    # A training loss that falls and then climbs back: "the loss first drops and then rises", "loss先降后升" (not an
    # evaluation loss: that is overfitting)
    (re.compile(r"(?<!eval )(?<!eval_)(?<!validation )(?<!val )(?<!val_)(?<!test )(?<!验证)(?<!验证集)(?<!测试)"
                r"(?:(?<![A-Za-z0-9_])loss|损失)[^.;。，,\n]{0,12}?(?:先\s*(?:下降|降低|降|减小|减少)\s*(?:后|再|然后)\s*(?:上升|升高|升|增大|增加|涨)|"
                r"(?:first\s+)?(?:drops?|dropped|decreas(?:es|ed)|falls?|fell|goes\s+down|went\s+down),?\s+(?:and\s+)?then\s+"
                r"(?:rises?|rose|increas(?:es|ed)|goes\s+up|went\s+up|climbs?|climbed|shoots?\s+up|shot\s+up))",
                re.IGNORECASE), "collapse"),
    (re.compile(r"不降反(?:升|增)|(?<!eval )(?<!eval_)(?<!validation )(?<!val_)(?<!验证)(?<!验证集)(?<!测试)"
                r"(?:loss|损失|grad_norm|梯度)[^。，,;；\n]{0,12}?(?:越来越(?:大|高)|(?:逐渐|持续|不断|一直)"
                r"(?:变大|增大|上升|升高|增加))|(?:loss|grad(?:ient)?[_ ]norm)"
                r"[^.;\n]{0,30}?(?:keeps? (?:growing|rising|increasing|climbing)|(?:rose|rises|grew|grows|climb(?:s|ed)?)"
                r" (?:abnormally|steadily|without bound)|abnormally (?:increas(?:es|ed)|grows|grew|rises|rose|climb(?:s|ed)))|"
                r"abnormally (?:high|large) (?:loss|grad(?:ient)?[_ ]norm)|"
                # "Abnormal loss rises during finetune_task_lora.sh"
                r"abnormal (?:loss|grad(?:ient)?[_ ]norm) (?:rises|rose|increas(?:es|ed)|spikes?|jump(?:s|ed)?)|"
                # "the GKD loss and gradient norm become unexpectedly large", "the loss grew abnormally large"
                r"(?:loss|grad(?:ient)?[_ ]norm)[^.;\n]{0,30}?(?:becomes?|became|grows?|grew|gets?|got) (?:unexpectedly|"
                r"abnormally|extremely|absurdly|very) (?:large|big|high|huge)|"
                r"(?:loss|grad(?:ient)?[_ ]norm) (?:becomes?|became|gets?|got) huge",
                re.IGNORECASE), "collapse"),
    # A pairwise (reward-model / preference) loss that cannot separate the pair (_PAIRWISE_TIE, above).
    (_PAIRWISE_TIE, "collapse"),
    (_ROLLOUT_MISMATCH, "rollout_mismatch"),
    # Advantages that are all zero give the policy no gradient ("gives all-zero advantages, so the policy gets no
    # learning signal", "优势全为 0"): the zero gradient of an RL run.
    # "the kernel produces zero gradients", "the gradients are all zero" (not "zero gradient accumulation steps")
    (re.compile(r"\b(?:produces?|produced|producing|gets?|got|getting|yields?|yielded|gives?|gave|returns?|returned|"
                r"all[- ]|with|has|have|had)\s+zero grad(?:ient)?s\b|\bgrad(?:ient)?s\s+(?:are|is|were|was|become|became|"
                r"stay|stayed|remain(?:ed)?)\s+(?:all\s+|always\s+)?(?:0|zero)(?![\w.])", re.IGNORECASE), "zero_grad"),
    (re.compile(r"all[- ]zero advantages?|zero advantages? (?:for|on|across) (?:all|every)|advantages? (?:are|is|were|was|"
                r"became|become|stay|stayed|remain(?:ed)?) (?:all |always )?(?:0|zero)(?![\w.])|"
                r"优势(?:值)?\s*(?:全|都|全部|一直)(?:是|为)\s*0(?![\d.])", re.IGNORECASE), "zero_grad"),
)
# "the loss fell from 4.31 to 1.44, then rose to 7.08, 15.06 and 16.02", "loss 降到 0.8 后又升到 6": a loss said in
# numbers to climb back to three times the low it had reached (and to at least 2) has diverged, though no word says so.
_NUM = r"(\d+(?:\.\d+)?)(?!\d|\.\d|e[-+]?\d)"
_PROSE_FELL = re.compile(r"(?:fell|falls|dropp?(?:ed|s)?|decreas\w*|went down|goes down|降到|降至|下降到|下降至|减小到|跌到)\s*"
                         r"(?:from\s+\S+\s+)?(?:to\s+|到\s*|至\s*)?(?:about |around |~|约)?" + _NUM, re.IGNORECASE)
_PROSE_ROSE = re.compile(r"(?:rose|rises|climb\w*|increas\w*|jump\w*|went up|goes up|shot up|spik\w*|升到|涨到|上升到|升高到|"
                         r"回升到|增大到|飙升到|升至|涨至)\s*(?:back\s+)?(?:again\s+)?(?:to\s+|到\s*|至\s*)?(?:about |around |~|约)?"
                         + _NUM + r"(?!\s*(?:k\b|steps?|samples?|tokens?|examples?|epochs?|iter\w*|%|步|条|个|轮))", re.IGNORECASE)
_OTHER_METRIC = re.compile(r"\blr\b|learning[ _]rate|学习率|grad|norm|\bkl\b|reward|acc|entropy|length|batch|梯度|奖励",
                           re.IGNORECASE)


def _climbs_back(line: str) -> bool:
    for sent in _SENTENCE_END.split(line):
        if not re.search(r"loss|损失", sent, re.IGNORECASE):
            continue
        low = _PROSE_FELL.search(sent)
        high = _PROSE_ROSE.search(sent, low.end()) if low else None
        if high and _OTHER_METRIC.search(sent, low.end(), high.start()):
            continue  # "loss fell to 0.5 and the lr increased to 3": another metric rose
        if high and float(high.group(1)) >= max(2.0, 3 * float(low.group(1))):
            return True
    return False


# "No errors, no nan", "without any inf", "没有出现 nan", "未报 nan": the symptom word is said to be absent.
# A negation reaches along a list of symptom words: "no NaN or inf appears", "没有出现 nan 或 inf".
_SAID_ABSENT = re.compile(r"(?:\bno|\bnot|\bnothing|\bneither|\bwithout|\bnever|\bzero|没有|没|无|未|不)\s*(?:(?:any|a)\s+|"
                          r"(?<=no )[A-Za-z][\w/-]{0,20}-[\w/-]{1,20}\s+|"  # "no reward-std collapse"
                          r"(?:出现|发现|见到|遇到|报告?|提到)\s*|(?:reported|mentioned|seen)\s+)?"
                          r"(?:(?:nans?|inf|infinity|overflows?|无穷大?|溢出)\s*(?:,|/|\bor\b|\bnor\b|\band\b|或者?|和|、)\s*)*$",
                          re.IGNORECASE)
# A symptom named as what a change prevents, not what happened: "Clip-Higher prevents entropy collapse", "to avoid
# NaN", "防止 loss 变成 nan"; and a collapse or divergence named as a risk: "Symmetric clipping can cause entropy
# collapse" (a NaN said that way is often the reporter's own: "I think fp16 may cause the nan").
_PREVENTED = re.compile(r"(?:\b(?:prevent\w*|avoid\w*|mitigat\w*|counteract\w*|guard\w* against|protect\w* against)|"
                        r"防止|避免|缓解|预防)[^.?!。？,，;；\n]{0,24}$", re.IGNORECASE)
_MAY_CAUSE = re.compile(r"(?:\b(?:can|could|may|might|would|will)\s+(?:\w+\s+)?(?:cause|lead to|result in|trigger)|"
                        r"\brisk of|\bprone to|\bsusceptible to|可能(?:会)?导致|容易导致|会导致|可能引起)[^.?!。？\n]{0,24}$",
                        re.IGNORECASE)
# What the reporter expected, not what happened (an issue form's "Expected behavior"): "the loss should not become
# nan", "grad_norm shouldn't be inf", "loss 不应该出现 nan".
_EXPECTED_NOT = re.compile(r"(?:\bshould(?:\s+not|n't)|\bmust(?:\s+not|n't)|不应该?|不该)\s*(?:(?:be(?:come)?|get|turn(?:\s+into)?|"
                           r"go(?:\s+to)?|produce|give|show|have|出现|变成|变为|为|是)\s*)?(?:(?:any|a)\s+)?$", re.IGNORECASE)
# A feature request or a question about what should happen if a metric went bad ("It would be useful to stop training
# when the loss is NaN", "skip the batch if grad_norm is nan", "What happens if the loss becomes 0?").
_WHEN_IT_HAPPENS = re.compile(r"(?:\b(?:stop|terminat\w*|skip\w*|abort\w*|halt\w*|detect\w*|check\w*|handl\w*|catch\w*|"
                              r"guard\w*|what happens|what if|how (?:to|do i|can i) (?:handle|avoid|detect))\b)[^.?!。？\n]{0,40}?"
                              r"\b(?:when|if|whenever|once|in case)\b[^.?!。？\n]{0,30}$", re.IGNORECASE)


def _when_it_happens(s: str, start: int) -> bool:
    """The words before s[start] ask what should happen if a metric went bad (`_WHEN_IT_HAPPENS`)."""
    window = s[max(0, start - 80):start]
    low = window.lower()
    return ("when" in low or "if" in low or "once" in low or "in case" in low) and bool(_WHEN_IT_HAPPENS.search(window))


# The fixed wording of generate()'s sampling error lists NaN and inf as possibilities ("probability tensor contains
# either `inf`, `nan` or element < 0"): the error id says it (prob_tensor_invalid), not a NaN symptom.
_ERROR_WORDING = re.compile(r"(?:contains either|probability tensor contains)[ \t`'\",/]{0,6}(?:inf[ \t`'\",/]{0,6})?$",
                            re.IGNORECASE)
# the same error cut short: "推理会报错`inf`, `nan` or element < 0"
_ERROR_TAIL = re.compile(r"[ \t`'\",]{0,6}(?:nan[ \t`'\",]{0,6})?or element\s*[<＜]\s*0", re.IGNORECASE)
# Megatron's "number of nan iterations:   0 |", a "nan_count: 0" column: NaNs counted and found none.
# (Bounded gaps: the pattern stays linear however many spaces a line holds.)
_COUNTED_ZERO = re.compile(r"[ \t_-]{0,3}(?:iterations?|iters?|steps?|counts?|grads?|gradients?|batch(?:es)?|samples?|"
                           r"tokens?|values?|occurrences?)?[ \t]{0,3}[:=][ \t]{0,8}0(?![\d.])", re.IGNORECASE)
# Only the training frameworks name the tool; DeepSpeed / transformers / torch appear in nearly every paste.
# At one position the earlier name wins: "Megatron-Bridge" over the "megatron" of Megatron-LM, "NeMo-RL" and "NeMo
# Automodel" over "NeMo".
_FW_ORDER = ["ms-swift", "OpenRLHF", "LLaMA-Factory", "verl", "xtuner", "trl", "unsloth", "DeepSpeed-Chat",
             "ColossalAI", "axolotl", "Megatron-Bridge", "Megatron-LM", "nemo-rl", "NeMo Automodel", "NeMo",
             "TransformerEngine", "torchtitan", "torchtune", "EasyR1", "AReaL", "SkyRL", "slime", "PaddleNLP",
             "MindSpeed-LLM", "mlx-lm", "InternEvo", "llm-foundry", "prime-rl", "open-instruct", "ROLL", "trlx",
             "safe-rlhf", "DeepSpeed", "transformers"]
_FW_AMBIGUOUS = {"torch", "pytorch", "transformers", "deepspeed", "hf trainer", *NAMES_THAT_ARE_WORDS}
_ALGO_AMBIGUOUS = {"rm", "pt", "reward", "gae"}


# A feature named as not in use: "I don't use sequence parallel", "没有开序列并行", "without LoRA", "sequence parallel
# is off", "未开启 shift_attn". Turned off as the fix ("序列并行关掉之后就正常了") is the opposite: the run had it.
_OFF_BEFORE = re.compile(r"(?:\b(?:don'?t|do not|doesn'?t|does not|didn'?t|did not|not|never|without|no)\s+(?:\w+\s+){0,2}|"
                         r"(?:没有|没|未|不|并未|并没有)(?:开启?|打开|启用|使用|用|开|加)?\s*(?:\w+\s*)?|"
                         r"(?:关闭|关掉|禁用|去掉)了?\s*|\b(?:turn|switch)(?:ed|ing|s)? off\s+(?:the\s+)?|\bdisabl\w*\s+(?:the\s+)?)$",
                         re.IGNORECASE)
_OFF_AFTER = re.compile(r"^\W{0,3}(?:(?:is|was|are|were)\s+(?:off|disabled|turned off|not (?:used|enabled|on))\b|"
                        r"(?:off|disabled)\b|(?:关闭|关掉|关了|禁用|未开启|没开|没有开))", re.IGNORECASE)


_FINE_BEFORE = re.compile(rf"(?:{SAID_FINE})[^.。;；\n]{{0,30}}$", re.IGNORECASE)


def _off_words(s: str, start: int, end: int) -> bool:
    """Words next to the feature at s[start:end] say it is off, not used, or turned off."""
    return bool(_OFF_BEFORE.search(s[max(0, start - 24):start]) or _OFF_AFTER.search(s[end:end + 16]))


_NAME_THEN_VALUE = re.compile(r"[\w.\-]*[\"']?[ \t]{0,40}(?:[:=]|(?<=[ \t])\d)")  # bounded: linear under search


def _in_setting_name(s: str, start: int, end: int) -> bool:
    """s[start:end] is part of a setting's name (`ulysses_sequence_parallel_size: 1`, `--context_parallel_size 1`):
    its value, read by the config stage, says whether the feature is on; the name alone says nothing."""
    head = start
    while head > 0 and (s[head - 1].isascii() and (s[head - 1].isalnum() or s[head - 1] in "_.-")):
        head -= 1
    named = s[head:end] != s[start:end] or re.match(r"[\w.]", s[end:end + 1] or " ") is not None
    return named and (s[head:head + 2] == "--" or _NAME_THEN_VALUE.match(s, end) is not None)


def _said_off(s: str, start: int, end: int) -> bool:
    """The feature at s[start:end] is said not to be in use by the run: not when turning it off was the fix
    ("序列并行关掉之后就正常了"), nor when "without it" is the comparison that trained ("no NaN without flash
    attention, NaN with it")."""
    if said_as_fix(s, start, end) or _FINE_BEFORE.search(s[max(0, start - 40):start]):
        return False
    return _off_words(s, start, end)


# Not inside a tool's name (LLaMA-Factory and its old name LLaMA-Efficient-Tuning, llama.cpp, LlamaIndex, Ollama,
# exllama) nor a README's placeholder ("path_to_llama_model", which names no model at all: _PLACEHOLDER).
_FAMILY_RX = [(fam, re.compile(rf"(?<![Oo])(?<!_to_)(?<!ex)(?:{rx})(?![-_ ]?(?:factory|efficient[-_ ]tuning)|\.cpp|[-_ ]?index)",
                                re.IGNORECASE))
              for fam, rx in MODEL_FAMILIES]
_PLACEHOLDER = re.compile(r"path[_/ -]?to|your[_-]|[<{$]", re.IGNORECASE)


def names_model_family(text: str) -> bool:
    """`text` names a model family ("qwen2.5-vl", "moe-llava"), not only a tool named after one (LLaMA-Factory)."""
    return any(rx.search(text) for _, rx in _FAMILY_RX)


_SHIFT_ATTN = re.compile(r"S(?:\^?2|²)[- ]?attn|S(?:\^?2|²)[- ]Attention|shift(?:ed)?[_ ]attn|shifted sparse attention|"
                         r"LongLoRA", re.IGNORECASE)
# "peft" names adapters in use, not the library installed (`PEFT version: 0.12.0`, `peft==0.12.0`) nor ms-swift's
# `--tuner_backend peft`, which a full fine-tune passes too.
# ASCII edges: "lora微调", "用qlora训练" put the name between Chinese characters, where `\b` finds no edge.
_LORA = re.compile(r"(?<![A-Za-z0-9_])q?lora(?![A-Za-z0-9_])|(?<![A-Za-z0-9_])(?:LoraConfig|get_peft_model)\(|"
                   r"(?<![A-Za-z0-9_])lora_(?:r|rank|alpha)[ \t]*=[ \t]*[1-9]|(?<!tuner_backend )(?<!tuner_backend=)(?<![A-Za-z0-9_])peft(?![A-Za-z0-9_])"
                   r"(?![ \t]*(?:version|==|>=|<=|~=|:[ \t]*v?\d|v?\d))", re.IGNORECASE)


# A full fine-tune named in words: "全参数微调", "全量微调", "full-parameter fine-tuning", "full finetuning",
# Unsloth's `full_finetuning=True`.
_FULL_FT = re.compile(r"全参数?(?:微调|训练|sft|\b)|全量(?:参数)?(?:微调|训练|sft)|full[- _]?(?:param(?:eter)?s?[- _]?)?"
                      r"(?:fine[- _]?tun\w*|finetun\w*|sft\b)(?!\w)(?![`'\"]?[ \t]*[:=][ \t]*[`'\"]?(?:false|0|no)\b)|"
                      r"full[- ]param(?:eter)?s?(?![A-Za-z0-9_])|"
                      r"full_finetuning\s*=\s*true", re.IGNORECASE)
# Words after a setting, in its clause, that say that run trained, beyond what says it fixed a run (WORKED_AFTER):
# "with LoRA trained normally", "LoRA runs of the same models trained.", "LoRA 微调正常", "were not affected".
_TRAINED_TOO = re.compile(r"[^.,;:!?。，；：！？\n]{0,30}?(?:\btrain(?:s|ed)?\b(?: (?:normally|well|ok))?(?=\s*(?:[.,;)]|$))|"
                          r"\btrained (?:fine|normally|well)|\b(?:are|were|runs?|ran|looks?|looked) (?:fine|normal(?:ly)?|"
                          r"ok(?:ay)?)|\b(?:is|was|are|were) (?:not |un)affected|正常|没有?问题|不受影响)", re.IGNORECASE)


def _alias_regex(alias: str) -> re.Pattern[str]:
    # `GRPOTrainer`, `ORPOConfig` name the algorithm too.
    return re.compile(r"(?<![A-Za-z])" + re.escape(alias).replace(r"\ ", r"[\s_-]") + r"(?=Trainer|Config|[^A-Za-z]|$)",
                      re.IGNORECASE)


_ALGO_ALIASES = [(name, a) for name, aliases in ALGORITHMS.items() for a in (name.lower(), *aliases)
                 if a not in _ALGO_AMBIGUOUS]
_ALGO_RX = [(name, _alias_regex(a)) for name, a in _ALGO_ALIASES]
_ALGO_RX.append(("RM", re.compile(r"reward[ _-]?model(?:ing|ling)?|reward\s?模型|奖励模型|\bRM\b")))
# "GRPO on the SFT'd model", "用 SAPO 训练 SFT 过的 Qwen", "after SFT": where the model came from, not the run's
# algorithm (an RL run whose report names its starting checkpoint first would read as supervised training).
# The lookahead follows the name, so it runs only where the name matched (before it, it would scan the rest of the
# word at every position of a paste: quadratic on a long line).
_SFT_PROVENANCE = r"(?!\w*\s*(?:过(?!程)|后的?|之后|权重|模型|checkpoint|ckpt|weights|model\b|'d|-ed\b|ed\b))"
_ALGO_RX = [(name, re.compile(r"(?<!after )(?<!经过)(?:" + rx.pattern + ")" + _SFT_PROVENANCE, rx.flags))
            if name == "SFT" else (name, rx) for name, rx in _ALGO_RX]
# "the pre-training model I'm using is llama2", "预训练模型是 qwen2": the checkpoint the run starts from, not a
# pretraining run.
_ALGO_RX = [(name, re.compile(r"(?:" + rx.pattern + r")(?!\s*(?:models?\b|模型|权重|weights?\b|checkpoints?\b|ckpt)|_mm|_adapter|/)",
                              rx.flags)) if name == "pretrain" else (name, rx) for name, rx in _ALGO_RX]
# A logged metric's path names the trainer's bookkeeping, not the algorithm: verl logs `actor/ppo_kl: ...` for GRPO
# runs too (a script's path still names it: examples/ppo_trainer/, scripts/reward_modeling.py). Checked per match in
# _run_algorithm: folded into each name's pattern it cost every paste a slower scan.
_METRIC_VALUE_AFTER = re.compile(r"[\w/]*['\"]?[ \t]*[:=]")


# ... or by a metric's own suffix, whatever follows it: "the actor/ppo_kl remains consistently 0"
_METRIC_SUFFIX_AFTER = re.compile(r"_(?:kl|clip_?frac|ratio|loss|entropy)(?![A-Za-z0-9])")


def _in_hub_name(text: str, m: re.Match[str]) -> bool:
    """`hiyouga/DPO-En-Zh-20k`, `argilla/dpo-mix-7k`: a dataset's or model's hub name, not the run's algorithm (a
    script, `examples/scripts/dpo.py`, still names it)."""
    start = max(text.rfind(c, 0, m.start()) for c in " \t\n\"'`(") + 1
    token = _TOKEN.match(text, start)
    return (token is not None and _HUB_NAME_TOKEN.fullmatch(token.group(0)) is not None
            and "/" in text[start:m.start()] and _NAME_GOES_ON.match(text, m.end()) is not None)


_NAME_GOES_ON = re.compile(r"[-_][A-Za-z0-9]")
_TOKEN = re.compile(r"[^\s\"'`()]{1,300}")
# `org/name` and nothing else: one slash, no file extension, not a local path (`examples/ppo_trainer/run.sh`,
# `outs/chatglm3_sft_ckt_result` under a folder still name the run's algorithm)
_HUB_NAME_TOKEN = re.compile(r"[A-Za-z0-9][\w.-]{0,60}/[\w.-]{1,100}(?<!\.py)(?<!\.sh)(?<!\.yaml)(?<!\.yml)(?<!\.json)[,.;:]?")


def _in_metric_path(text: str, m: re.Match[str]) -> bool:
    return m.start() > 0 and text[m.start() - 1] == "/" and (_METRIC_VALUE_AFTER.match(text, m.end()) is not None
                                                             or _METRIC_SUFFIX_AFTER.match(text, m.end()) is not None)
# (not inside a dotted key: verl's `actor_rollout_ref.actor.megatron.use_mbridge` names Megatron as its backend)
_FW_ALIASES = [(name, a) for name in _FW_ORDER for a in (name.lower(), *FRAMEWORKS.get(name, ()))
               if a not in _FW_AMBIGUOUS or name in ("DeepSpeed", "transformers")]
_FW_RX = [(name, re.compile(r"(?<!\.)" + _alias_regex(a).pattern, re.IGNORECASE)) for name, a in _FW_ALIASES]
# Another package whose name holds the word is not the library: sentence-transformers, transformers_stream_generator,
# transformers-neuronx, deepspeed-mii.
_FW_RX = [(name, re.compile(r"(?<![A-Za-z0-9]-)(?:" + rx.pattern + r")(?![-_](?:mii|neuronx|stream))", rx.flags))
          if name in ("DeepSpeed", "transformers") else (name, rx) for name, rx in _FW_RX]
# A lowercase word every match of a name regex contains (None: no cheap pre-test), keyed by the regexes as they are
# finally used (the rewrapped SFT / pretrain patterns and the framework patterns are objects of their own).
_HINTS: dict[re.Pattern[str], str] = {}
for (_name, _a), (_, _rx) in [*zip(_ALGO_ALIASES, _ALGO_RX), *zip(_FW_ALIASES, _FW_RX)]:
    _m = re.match(r"[a-z0-9]+", _a.lower())
    if _m:
        _HINTS[_rx] = _m.group(0)
for _fam, _rx in _FAMILY_RX:
    _m = re.match(r"(?:\\b)?([a-z]+)", _rx.pattern)
    if _m:
        _HINTS[_rx] = _m.group(1)


# A throughput or hardware figure just before a word: `Peak FLOPS (BF16): inf`, `mfu: nan`, `tokens/s: inf` say
# nothing about the loss or the run's precision.
_HARDWARE_FIGURE = re.compile(r"(?:flops|\bmfu|throughput|\btok(?:en)?s?/s(?:ec)?|\bsamples?/s(?:ec)?|\bit/s|\bs/it|吞吐量?)"
                              r"[^,;|\n]{0,24}$", re.IGNORECASE)
# A dtype the reporter could not use is not the run's dtype.
# A dtype the reporter tried and dropped ("I tried fp16 first", "试过 fp16") is not the run's; one named in a question
# ("should I use fp16 or bf16?", "要不要换成 bf16？") is not a setting at all (issue 11: "a setting the reporter tried
# and dropped, or merely asks about, is not the setting of the run").
_TRIED = re.compile(r"(?:\btried|\btrying|试过|尝试过|也试了|试了)\s*(?:\w+\s+){0,2}$", re.IGNORECASE)
_QUESTION = re.compile(r"[?？]\s*$|^\s*(?:should|shall|can|could|would|do|does|is it|are)\b|"
                       r"(?:是否|要不要|能不能|该不该|需不需要|可不可以)[^，,]*$", re.IGNORECASE)
_BETTER = re.compile(r"不再|no longer|不会再|没有再", re.IGNORECASE)  # "改成 bf16 后不再一直为 0，但偶尔仍为 0": it helped
# What follows a switch says it did not help: "switched to bf16; the loss is still nan", "换成 bf16 还是 nan".
_STILL_BAD = re.compile(r"\b(?:still|again|the same)\b[^.。\n]{0,30}?(?:(?<![A-Za-z])(?:nan|inf)(?![A-Za-z])|\b0(?:\.0+)?\b|"
                        r"zero|diverg|explod)|(?:还是|仍然|依然|仍|照样|依旧)[^。\n]{0,10}?(?:nan|inf|为\s*0|是\s*0|0|发散|爆炸)",
                        re.IGNORECASE)
_NOT_SUPPORTED_AFTER = re.compile(r"[ \t]{0,4}(?:(?:is|was)[ \t]{0,4}(?:not|n't)[ \t]{1,4}(?:supported|available)|"
                                  r"isn'?t[ \t]{1,4}(?:supported|available)|"
                                  r"(?:不被)?不支持|用不了|不可用)", re.IGNORECASE)  # "bf16 is not supported on my GPU"
_CANNOT_USE = re.compile(r"(?:不支持|用不了|不能用|无法使用|没法用|不可用|can(?:'|no)?t use|cannot use|can(?:'|no)?t (?:work|run) (?:on|with)|"
                         r"cannot (?:work|run) (?:on|with)|(?:doesn'?t|does not|don'?t|"
                         r"do not) support|no support for|unsupported)\s*$", re.IGNORECASE)


_NEGATED_DTYPE = re.compile(r"(?:(?<![A-Za-z])non[- ]?|非 ?|(?:没有?|未|不)(?:使用|用|开启?|启用)\s*|"
                            r"(?:not|never|without|didn'?t|did not|don'?t|do not)\s+(?:using\s+|use\s+)?)$", re.IGNORECASE)
# ("没有使用bf16", "not using bf16": a dtype the run did not use)


_PARTS = re.compile(r"[,，、]")
_COMPLETION_ONLY = re.compile(r"(?<![\w.])(?:train_on_responses_only|DataCollatorForCompletionOnlyLM)\(")
_HARDWARE_AFTER = re.compile(r"[ \t-]{0,2}(?:GEMMs?|matmuls?|check|benchmark|tflops|flops)\b", re.IGNORECASE)  # "a bf16 GEMM check"
_INSTEAD_OF = re.compile(r"instead of[ \t]*$|rather than[ \t]*$|而不是[ \t]*$", re.IGNORECASE)
_HUB_ID = re.compile(r"(?<![\w/.:$-])(?P<org>[A-Za-z0-9][\w-]{1,38})/(?P<name>[A-Za-z0-9][\w.-]{1,80}[A-Za-z0-9])(?![\w/-]|\.[A-Za-z0-9])"
                     r"(?<!\.py)(?<!\.sh)(?<!\.yaml)(?<!\.yml)(?<!\.json)(?<!\.txt)(?<!\.md)(?<!\.ipynb)")  # files are no models
# first parts of a path, not a hub organisation
_NOT_AN_ORG = frozenset({"examples", "example", "src", "scripts", "script", "data", "configs", "config", "home", "mnt",
                         "models", "model", "root", "workspace", "output", "outputs", "checkpoints", "ckpt", "tmp",
                         "datasets", "dataset", "recipes", "train", "tests", "docs", "user", "users", "opt", "usr",
                         "results", "result", "runs", "logs", "saves", "save", "ckpts", "exp", "experiments"})
_DTYPE_PAIR_BEFORE = re.compile(r"(?:fp16|bf16|fp32|fp8|float16|bfloat16|float32)[ \t]?/[ \t]?$", re.IGNORECASE)
_DTYPE_PAIR_AFTER = re.compile(r"[ \t]?/[ \t]?(?:fp16|bf16|fp32|fp8|float16|bfloat16|float32)(?![A-Za-z0-9])", re.IGNORECASE)
# trl's installed version in an environment list ("- TRL version: 0.9.6", "trl 0.19.0", "trl==0.9.6"): LLaMA-Factory,
# unsloth and others install it; it names no framework the report ran.
_DEPENDENCY_LINE = re.compile(r"^[\s>*|\[\]\d-]{0,12}trl[ \t]*(?:version)?[ \t]*(?:[:=：]=?|\||[<>~]=)?[ \t]*v?\d+\.\d+",
                              re.IGNORECASE)
# `from transformers import AutoTokenizer`: a tokenizer or a model class from transformers, not its Trainer running the
# job (EasyDeL's DPOTrainer on a TPU).
_HELPER_IMPORT = re.compile(r"^\s*from\s+transformers\s+import\s+(?![^\n]*Trainer)")
# A form's label with nothing after it: "- Transformers:", "Megatron version: ", "* DeepSpeed 版本："
_EMPTY_FIELD = re.compile(r"^[\s>*#-]{0,8}[A-Za-z][\w .-]{0,30}?(?:[ _]?(?:version|版本))?[ \t]*[:：][ \t]*$", re.IGNORECASE)


def _empty_field(lines: list[tuple[int, str]], n: int, s: str) -> bool:
    """Line `n` (`s`) is a form's label left empty, not a YAML key whose block follows on deeper-indented lines."""
    if not _EMPTY_FIELD.match(s):
        return False
    at = next((i for i, (m, _) in enumerate(lines) if m == n), None)
    nxt = next((t for _, t in lines[at + 1:] if t.strip()), "") if at is not None else ""
    indent = len(s) - len(s.lstrip())
    return not (nxt and len(nxt) - len(nxt.lstrip()) > indent)


_UPCAST = re.compile(r"upcast\w*", re.IGNORECASE)
_DEFAULT_DTYPE = re.compile(r"default dtype[ \t]{1,3}(?:torch\.)?$", re.IGNORECASE)
_STORED_AFTER = re.compile(r"[ \t-]{0,2}(?:weights?|checkpoints?|quantiz\w*|quantis\w*|model|experts?|moe)\b", re.IGNORECASE)
# A quantized run (QLoRA, 4-bit) set against its unquantized counterpart, named by "full-precision" + the thing.
_FULL_PRECISION_OTHER = re.compile(r"[ \t]{1,3}(?:LoRA|model|baseline|weights|counterpart|version|checkpoint)s?\b",
                                   re.IGNORECASE)
_QUANTIZED = re.compile(r"qlora|(?<![A-Za-z0-9])(?:4|8)[- ]?bit|\bnf4\b|\bint[48]\b|bitsandbytes", re.IGNORECASE)


_CONTRAST = re.compile(CONTRAST, re.IGNORECASE)  # each dtype its own verdict


def _part_of(clause: str, start: int, end: int) -> str:
    """The part of `clause` around [start, end), cut at commas and at a contrast ("but", "但"): where a dtype's own
    verdict is said ("bf16 with ZeRO-0 grows, normal with ZeRO-1" keeps bf16's verdict apart from ZeRO-1's)."""
    left = max(clause.rfind(c, 0, start) for c in ",，、")
    rights = [i for i in (clause.find(c, end) for c in ",，") if i >= 0]
    for m in _CONTRAST.finditer(clause):
        if m.end() <= start:
            left = max(left, m.end() - 1)
        elif m.start() >= end:
            rights.append(m.start())
    return clause[left + 1: min(rights) if rights else len(clause)]


def _precision_mentions(lines: list[tuple[int, str]], facts: Facts, source: str) -> None:
    for n, s in lines:
        for cm in _CLAUSE.finditer(s):
            clause = cm.group(0)
            clause_good: bool | None = None  # searched once per clause, not once per dtype word in it
            for m in DTYPE_WORD.finditer(clause):
                # `"fp16": {...}`, `--fp16`, `fp16=True` are settings, read by kb.facts.configs.
                before = clause[max(0, m.start() - 40): m.start()]  # bounded: a slice per match, not the prefix
                if _SETTING_AFTER.match(clause, m.end()) or _SETTING_BEFORE.search(before[-2:]) \
                        or _HARDWARE_FIGURE.search(before) or _HARDWARE_AFTER.match(clause, m.end()):
                    continue  # `Peak FLOPS (BF16)`: what the GPU can do, not what the run uses
                d = DTYPE_OF_WORD.get(fold(m.group(1)))  # fold: IGNORECASE matched "İ" / "ſ" too
                if d is None:
                    continue
                if d == "fp4" and _STORED_AFTER.match(clause, m.end()):
                    continue  # "gpt-oss mxfp4 weights": how the checkpoint is stored, not what the training GEMMs run in
                if _NEGATED_DTYPE.search(before):
                    continue  # "its default (non-bf16) precision", "非 bf16": not the run's dtype
                if _DEFAULT_DTYPE.search(s, max(0, cm.start() + m.start() - 30), cm.start() + m.start()):
                    continue  # LLaMA-Factory's "Instantiating ... under default dtype torch.bfloat16.": the load dtype
                if d == "fp32" and _UPCAST.search(before):
                    continue  # LLaMA-Factory's "Upcasting trainable params to float32." in every LoRA run
                if d == "fp32" and fold(m.group(1))[:4] == "full" and _FULL_PRECISION_OTHER.match(clause, m.end()) \
                        and _QUANTIZED.search(s):
                    continue  # "QLoRA adds error that plain full-precision LoRA does not have": the comparison
                if _DTYPE_PAIR_BEFORE.search(before) or _DTYPE_PAIR_AFTER.match(clause, m.end()):
                    continue  # "NaN in training (fp16/bf16)": both named, neither is the run's
                if _CANNOT_USE.search(before) or _NOT_SUPPORTED_AFTER.match(clause, m.end()):
                    # "V100，用不了 bf16", "my GPU doesn't support bf16": what the run could not use.
                    if d == "bf16":
                        facts.set("gpu_bf16", False, "text", n, clause, source)
                    continue
                part = _part_of(clause, m.start(), m.end())
                lead = part[: part.find(m.group(0))] if m.group(0) in part else before
                if _QUESTION.search(part) or _QUESTION.search(lead) or SUPPOSED.search(lead):
                    continue  # "should I use fp16 or bf16?", "要不要换成 bf16", "假如用bf16来微调的话"
                after = s[cm.start() + m.end(): cm.start() + m.end() + 60]
                still = _STILL_BAD.search(after)
                if FIX_CUE.search(before) and still and not _BETTER.search(after[: still.start()]):
                    facts.set("precision", d, "text", n, clause, source)  # switched to it, and it still fails
                    continue
                if _INSTEAD_OF.search(before):
                    continue  # "changed it to FP16 instead of BF16": the dtype given up, neither run nor fix
                if _TRIED.search(before):
                    # tried and dropped; a bf16 / fp32 tried that trained is the setting that worked
                    if d in ("bf16", "fp32") and (_GOOD.search(part) or _GOOD.search(clause)):
                        facts.set("working_dtype", d, "text", n, clause, source)
                    continue
                if _GOOD.search(part):
                    good = True
                elif WENT_BAD.search(part):
                    good = False  # "grad norm keeps growing with ZeRO-0 + bf16, normal with ZeRO-1/2/3"
                else:
                    if clause_good is None:
                        clause_good = any(_GOOD.search(p) and not _QUESTION.search(p) for p in _PARTS.split(clause))
                    good = clause_good
                good = good or bool(FIX_CUE.search(before))
                if good and d in ("bf16", "fp32"):
                    facts.set("working_dtype", d, "text", n, clause, source)
                elif d == "fp16" and _INFERENCE.search(clause) and good:
                    continue  # "inference in fp16 is fine" says nothing about training
                elif d == "fp16" and _GOOD.search(part) and not WENT_BAD.search(part) and WENT_BAD.search(clause):
                    continue  # "fp16 works well but bf16 loss is nan": the dtype that worked, beside the one that failed
                elif not good or d == "fp16":
                    facts.set("precision", d, "text", n, clause, source)
            m = _MODEL_HALF.search(clause)
            # "loading the model in fp16 for inference is fine": the weights of a generation run, not the trained ones
            if m and not FIX_CUE.search(clause[max(0, m.start() - 40): m.start()]) and not _INFERENCE.search(clause):
                facts.set("weights_dtype", "fp16", "text", n, clause, source)


# "similar to https://github.com/volcengine/verl/issues/2626", "see hiyouga/LLaMA-Factory#4020"
# An image or a wiki page of a repository (`.../llama3-Chinese-chat/assets/...png`, `.../Chinese-LLaMA-Alpaca-3/wiki`)
# names the repository it is stored in, not the run's model or tools (a file run from one, `.../blob/main/x.yaml`,
# still names the tool).
_THREAD_LINK = re.compile(r"https?://(?:www\.)?git(?:hub|ee|code)\.(?:com|net)/[^\s/]+/[^\s/]+/(?:issues|pull|discussions|"
                          r"assets|wiki)\b[^\s)\]>]*|"
                          r"https?://[\w.-]*githubusercontent\.com/[^\s)\]>]*|"
                          r"(?<![\w/.\-])[\w.-]+/[\w.-]+#\d+\b", re.IGNORECASE)


class _Joined:
    """The lines as one string, so each of ~100 name regexes runs once over the paste instead of once per line."""

    def __init__(self, lines: list[tuple[int, str]]):
        self.lines = lines
        # A link to another thread names its repository, not this run's tools: blanked, positions kept.
        self.text = _THREAD_LINK.sub(lambda m: " " * len(m.group(0)), "\n".join(s for _, s in lines))
        self.low = fold(self.text)
        self.starts: list[int] = []
        pos = 0
        for _, s in lines:
            self.starts.append(pos)
            pos += len(s) + 1

    def first(self, rx: re.Pattern[str]) -> tuple[int, int] | None:
        """(index into lines, column) of the first match."""
        hint = _HINTS.get(rx)
        if hint and hint not in self.low:
            return None  # a plain substring test is far cheaper than the case-insensitive regex over a big log
        m = rx.search(self.text)
        if m is None:
            return None
        i = bisect.bisect_right(self.starts, m.start()) - 1
        return i, m.start() - self.starts[i]


def _first(joined: _Joined, rxs: list[tuple[str, re.Pattern[str]]]) -> tuple[str, int, str] | None:
    best: tuple[int, int, int, str] | None = None  # (line index, column, order, name)
    for order, (name, rx) in enumerate(rxs):
        got = joined.first(rx)
        if got is not None and (best is None or got < best[:2]):
            best = (got[0], got[1], order, name)
    if best is None:
        return None
    n, s = joined.lines[best[0]]
    return best[3], n, s


# "Pretraining looked normal, but the fine-tuning stage showed a loss of 0", "pretraining completed and produced the
# projector; the fine-tuning stage ...": a stage of the recipe that went through, before the one that failed.
_STAGE_DONE = re.compile(r"[^.,;:!?。，；：！？\n]{0,30}?(?:\b(?:completed|finished|succeeded|went (?:fine|well)|"
                         r"(?:looked|was|ran) (?:normal|fine|ok)|is (?:done|fine)|works? fine|worked fine|went fine)\b|正常|完成|没问题)", re.IGNORECASE)
# The stage after it when the first was pretraining: LLaVA-style recipes pretrain a projector, then fine-tune.
_FINETUNE_STAGE = re.compile(r"fine-?tun\w*|(?:instruction|visual instruction)"
                             r"[- ]tuning|\bstage[- ]?2\b|第二阶段|微调阶段|指令微调", re.IGNORECASE)


def _run_algorithm(joined: _Joined) -> tuple[str, int, str] | None:
    """The algorithm named first, passing over an earlier stage said to have gone through when another follows."""
    found = []
    for order, (name, rx) in enumerate(_ALGO_RX):
        hint = _HINTS.get(rx)
        if hint and hint not in joined.low:
            continue
        m = next((m for m in rx.finditer(joined.text) if not _in_metric_path(joined.text, m)
                  and not _in_hub_name(joined.text, m)
                  # verl's `main_ppo` entry point runs every RL algorithm (kb.facts.configs reads its command)
                  and not (name == "PPO" and joined.text.endswith("main_", 0, m.start()))), None)
        if m is not None:
            found.append((m.start(), order, name, m.end()))
    found.sort()
    for i, (pos, _, name, end) in enumerate(found):
        if _STAGE_DONE.match(joined.text, end):
            if any(f[2] != name for f in found[i + 1:]):
                continue
            later = _FINETUNE_STAGE.search(joined.text, end) if name == "pretrain" else None
            if later is not None:  # LLaVA-style recipes: stage 1 pretrains the projector, stage 2 fine-tunes
                pos, name = later.start(), "SFT"
        line = bisect.bisect_right(joined.starts, pos) - 1
        n, s = joined.lines[line]
        return name, n, s
    return None


def _family(joined: _Joined) -> tuple[str, int, str] | None:
    """The family named on the earliest line (the first in MODEL_FAMILIES order when a line names several)."""
    best: tuple[int, int, str] | None = None
    for order, (fam, rx) in enumerate(_FAMILY_RX):
        got = joined.first(rx)
        if got is not None and (best is None or (got[0], order) < best[:2]):
            best = (got[0], order, fam)
    if best is None:
        return None
    n, s = joined.lines[best[0]]
    return best[2], n, s


_INSTALL_LINE = re.compile(r"^[ \t]*[%!]?(?:(?:python3? -m |uv )?pip3?|conda|mamba)[ \t]+(?:install|uninstall|remove)\b",
                           re.IGNORECASE)


def extract(lines: list[tuple[int, str]], facts: Facts, source: str) -> None:
    # `%pip uninstall torch transformers trl peft -y`: packages installed or removed, not a run's framework or adapters
    lines = [(n, s) for n, s in lines if not _INSTALL_LINE.match(s)]
    _precision_mentions(lines, facts, source)
    joined = _Joined(lines)
    got = _run_algorithm(joined)
    if got:
        old = facts.get("algorithm")
        if old is not None and old.value == "PPO" and "main_ppo" in old.detail and got[0] != "PPO":
            facts.items.pop("algorithm")  # verl's main_ppo runs every RL algorithm: the one the reporter names wins
        facts.set("algorithm", got[0], "text", got[1], got[2], source)
    specific = [(name, rx) for name, rx in _FW_RX if name not in ("DeepSpeed", "transformers")]
    fw_joined = joined
    for _ in range(3):
        got = _first(fw_joined, specific)
        if got is None:
            # DeepSpeed / transformers only as the fallback, and not when said unused ("not using deepspeed")
            got = _first(fw_joined, [(n, r) for n, r in _FW_RX if n in ("DeepSpeed", "transformers")])
            m = dict(_FW_RX)[got[0]].search(got[2]) if got else None
            if m and _said_off(got[2], m.start(), m.end()):
                got = None
        if got is None or not (_empty_field(fw_joined.lines, got[1], got[2])
                                or (got[0] == "trl" and _DEPENDENCY_LINE.match(got[2]))
                                or (got[0] == "transformers" and _HELPER_IMPORT.match(got[2]))):
            break
        # an issue form's field left empty ("- Transformers:", "Megatron version: "): the name states nothing
        fw_joined = _Joined([(n, s) for n, s in fw_joined.lines if n != got[1]])
    if got:
        facts.set("framework", got[0], "text", got[1], got[2], source)
    m = _COMPLETION_ONLY.search(joined.text) if "(" in joined.text else None
    if m and "completion_only_loss" not in facts:
        # unsloth's train_on_responses_only(...), TRL's DataCollatorForCompletionOnlyLM(...): the loss is computed on
        # the responses only, the masking these reports are about
        line = bisect.bisect_right(joined.starts, m.start()) - 1
        facts.set("completion_only_loss", True, "text", joined.lines[line][0], joined.lines[line][1], source)
    if "model" not in facts and "/" in joined.text:
        # a hub id said in a sentence: "finetune the unsloth/llama-3-8b-bnb-4bit model", "meta-llama/Llama-3.1-8B"
        for m in _HUB_ID.finditer(joined.text):
            if m.group("org").lower() not in _NOT_AN_ORG and any(rx.search(m.group("name")) for _, rx in _FAMILY_RX):
                line = bisect.bisect_right(joined.starts, m.start()) - 1
                n, s = joined.lines[line]
                facts.set("model", m.group(0), "text", n, s, source)
                break
    if "model_family" not in facts:
        model = facts.get("model")  # the model the run loads names its family before any other line does
        if model is not None and _PLACEHOLDER.search(str(model.value)):
            model = None  # a README's placeholder ("path_to_llama_model") names no model
        fam = next((f for f, rx in _FAMILY_RX if rx.search(str(model.value))), None) if model is not None else None
        got = (fam, model.line, model.detail) if fam and model is not None else _family(joined)
        if got:
            facts.set("model_family", got[0], "text", got[1], got[2], source)
    mentions_ds = re.search(r"deepspeed|zero[-_ ]?(?:stage|[0-3]\b|optimi[sz])|\bds_z", joined.text, re.IGNORECASE) is not None
    # Each pattern below runs on every line: one substring test over the paste drops those that cannot match.
    hay = Haystack(joined.text, joined.low)
    sp, zero, collapse, shift_attn, kl_k3, length_norm, lora, prose_metric, trajectory, metric_rev, lr_fix, \
        loss_type, kto_words, lightning, spike, prose_lr, version_words, huge, from_start, spike_rev = (
            hay.gate(rx) for rx in (
                _SP, _ZERO, _COLLAPSE, _SHIFT_ATTN, _KL_K3, _LENGTH_NORM, _LORA, _PROSE_METRIC, _TRAJECTORY,
                _PROSE_METRIC_REV, _LR_FIX, _LOSS_TYPE, _KTO_WORDS, _LIGHTNING, _PROSE_SPIKE, _PROSE_LR, _VERSION_WORDS,
                _PROSE_HUGE, _FROM_START, _PROSE_SPIKE_REV))
    metric_adj = hay.gate(_PROSE_METRIC_ADJ)
    kl_loss = hay.gate(_KL_LOSS)
    metric_zh = hay.gate(_PROSE_METRIC_ZH)
    metric_then = hay.gate(_PROSE_METRIC_THEN)
    at_step = hay.gate(_AT_STEP)
    every_step = hay.gate(_EVERY_STEP)
    high_loss = hay.gate(_PROSE_HIGH_LOSS)
    large_norm = hay.gate(_PROSE_LARGE_NORM)
    advantage = hay.gate(_PROSE_ADVANTAGE)
    may_climb = hay.may(_PROSE_FELL) and hay.may(_PROSE_ROSE)
    attn = [(rx, impl) for rx, impl in _ATTN if hay.may(rx)]
    full_ft = hay.gate(_FULL_FT)
    adapters: list[tuple[bool, int, str]] = []  # (the comparison that worked, line, text) per LoRA mention
    full: list[tuple[bool, int, str]] = []  # the same per full fine-tuning mention
    symptoms = [(rx, sym) for rx, sym in _SYMPTOM if hay.may(rx)]
    for n, s in lines:
        m = sp.search(s)
        if m and not _in_setting_name(s, m.start(), m.end()):
            facts.set("sequence_parallel", not _said_off(s, m.start(), m.end()), "text", n, s, source)
            if said_as_fix(s, m.start(), m.end()) and _off_words(s, m.start(), m.end()):
                facts.add("fix_changes", "sequence_parallel_size=1", "text", n, s, source)  # "关掉之后就正常了"
        m = zero.search(s)
        if m and mentions_ds and not _said_off(s, m.start(), m.end()):
            facts.set("zero_stage", int(next(g for g in m.groups() if g)), "text", n, s, source)
        for rx, impl in attn:
            m = rx.search(s)
            if m:
                if said_as_fix(s, m.start(), m.end()) and _off_words(s, m.start(), m.end()):
                    # "关闭 flash attention 后正常", "turning flash attention off fixed it": the run had it
                    facts.set("attn_implementation", impl, "text", n, s, source)
                    facts.add("fix_changes", "attn_implementation=eager", "text", n, s, source)
                elif said_as_fix(s, m.start(), m.end()):  # "switching to eager attention fixes it"
                    facts.add("fix_changes", f"attn_implementation={impl}", "text", n, s, source)
                elif _said_off(s, m.start(), m.end()):
                    pass  # "I'm not using flash attention": which kernel the run uses is not said
                else:
                    facts.set("attn_implementation", impl, "text", n, s, source)
                break
        if collapse.search(s):
            facts.set("output_collapse", True, "text", n, s, source)
            facts.add("symptom", "collapse", "text", n, s, source)
        m = shift_attn.search(s)
        if m and not _said_off(s, m.start(), m.end()):
            facts.set("shift_attn", True, "text", n, s, source)
        m = kl_k3.search(s)
        if m:
            facts.set("kl_estimator", "k3", "text", n, s, source)
        m = kl_loss.search(s)
        if m and not said_as_fix(s, m.start(), m.end()):
            facts.set("use_kl_loss", not _said_off(s, m.start(), m.end()), "text", n, s, source)
        if length_norm.search(s):
            facts.set("average_log_prob", True, "text", n, s, source)
        # the one switched to is tried beside the run, whatever came of it ("全参数微调 OOM，换 LoRA 脚本也一样")
        for m in lora.finditer(s):
            if not _said_off(s, m.start(), m.end()):  # "without LoRA, full fine-tuning"
                adapters.append((_compared_ok(s, m.end()) or _switched_to(s, m.start()), n, s))
        for m in full_ft.finditer(s):
            full.append((_compared_ok(s, m.end()) or _switched_to(s, m.start()), n, s))
        for m in prose_lr.finditer(s):
            lr = float(m.group("v"))
            if not 0 < lr < 1:
                continue  # "lr 2" is a step count or a list item, not a learning rate
            if FIX_CUE.search(s[: m.start()]) or _WORKED.match(s, m.end()) or said_as_fix(s, m.start(), m.end()):
                # the setting that made it work: a learning rate below the run's is the fix "lower the lr"
                # ("默认学习率 5e-5 ... 把学习率改成 1e-6 后训练稳定收敛")
                run_lr = facts.value("learning_rate")
                if isinstance(run_lr, (int, float)) and lr < run_lr:
                    facts.add("fix_changes", "learning_rate=lower", "text", n, s, source)
            elif "learning_rate" not in facts:
                facts.set("learning_rate", lr, "text", n, s, source)
        for m in [*_spikes(spike, s), *spike_rev.finditer(s)]:
            before = s[max(0, m.start() - 16):m.start()] if m.re is _PROSE_SPIKE_REV else ""
            if _NEGATED.search(m.group("gap")) or _NEGATED.search(before) \
                    or _NO_BEFORE.search(s, max(0, m.start() - 12), m.start()):  # "there is no loss spike"
                continue  # "the loss does not spike", "loss 没有突增", "no spikes in the loss"
            if _PREVENTED.search(s, max(0, m.start() - 30), m.start()):
                continue  # "warmup to avoid loss spikes"

            name = m.group("m").lower()
            if name == "norm" and _GRAD_BEFORE.search(s[max(0, m.start("m") - 12):m.start("m")]):
                name = "grad_norm"  # "gradient-norm spikes"
            facts.add("spike_metrics", {"梯度": "grad_norm", "损失": "loss"}.get(name, name), "text", n, s, source)
            facts.add("symptom", "collapse", "text", n, s, source)  # a divergence, as "loss spikes" already is
        for m in lightning.finditer(s):
            if FIX_CUE.search(s[: m.start()]):
                continue  # "switched to 16-mixed and it trained": the setting that worked, not the run's
            compute, weights = LIGHTNING_PRECISION[m.group(0).lower()]
            facts.set("precision", compute, "text", n, s, source)
            if weights:
                facts.set("weights_dtype", weights, "text", n, s, source)
        for m in prose_metric.finditer(s):
            if not _gap_ok(m.group("gap")):
                continue
            _prose_metric(facts, m.group("m"), m.group("v"), n, s, source, m.start("m"))
        for m in metric_then.finditer(s):
            if _NEGATED.search(m.group("gap")) or _SAID_ABSENT.search(s[max(0, m.start() - 12):m.start()]):
                continue
            _prose_metric(facts, {"损失": "loss", "梯度范数": "grad_norm"}.get(m.group("m"), m.group("m")), m.group("v"),
                          n, s, source, m.start("m"))
        for m in (_LOSS_TENSOR.finditer(s) if "grad_fn" in s else ()):
            _prose_metric(facts, "loss", m.group("v"), n, s, source)
        for m in metric_zh.finditer(s):
            if _gap_ok(m.group("gap")) and not _SAID_ABSENT.search(s[max(0, m.start() - 12):m.start()]):
                name = next(en for zh, en in _ZH_METRIC if m.group("m").lower().startswith(zh))
                _prose_metric(facts, name, m.group("v"), n, s, source, m.start("m"))
        for m in trajectory.finditer(s):
            _prose_metric(facts, m.group("m"), m.group("v"), n, s, source, m.start("m"))
        for m in huge.finditer(s):
            name = m.group("m").strip("/").lower()
            if (is_loss_like(name) or is_grad_norm(name)) and not is_limit_name(name) and float(m.group("v")) > HUGE_VALUE:
                facts.add("huge_metrics", name, "text", n, s, source)
                facts.add("symptom", "huge", "text", n, s, source)
        for m in advantage.finditer(s):
            if abs(float(re.sub(r"[\s,±+−-]", "", m.group("v")))) >= 100 and not _NEGATED.search(m.group("gap")):
                facts.add("huge_metrics", "advantages", "text", n, s, source)
                facts.add("symptom", "huge", "text", n, s, source)
        for m in large_norm.finditer(s):
            if not (_NEGATED.search(m.group("gap")) or _SAID_ABSENT.search(s[max(0, m.start() - 12):m.start()])
                    or _EXPECTED_NOT.search(s[max(0, m.start() - 40):m.start()])):
                facts.add("huge_metrics", "grad_norm", "text", n, s, source)
                facts.add("symptom", "huge", "text", n, s, source)
        for m in high_loss.finditer(s):
            if 100 <= float(m.group("v")) <= HUGE_VALUE:
                facts.add("huge_metrics", "loss", "text", n, s, source)
                facts.add("symptom", "huge", "text", n, s, source)
        # The value before its metric ("nan in the loss", "a NaN eval loss"), unless said absent ("no NaN loss",
        # "there is no nan in the loss").
        m = _NAN_GRADS.search(s) if "grad" in s.lower() else None
        if m and not _SAID_ABSENT.search(s[max(0, m.start() - 40):m.start()]):
            _prose_metric(facts, "gradients", "nan", n, s, source)
        for m in (_NOT_FINITE.finditer(s) if "finite" in s.lower() else ()):
            name = (m.group("m") or m.group("m2")).lower()
            name = "grad_norm" if name.startswith("grad") and " " in name else name
            _prose_metric(facts, name, "nan", n, s, source, m.start("m") if m.group("m") else m.start("m2"))
        for m in [*metric_rev.finditer(s), *metric_adj.finditer(s)]:
            if _SAID_ABSENT.search(s[max(0, m.start() - 40):m.start()]):
                continue
            name = m.group("m").lower()
            if m.re is _PROSE_METRIC_ADJ:
                name = ("loss" if name.startswith("loss") else "grad_norm" if "norm" in name
                        else "gradients" if name.startswith("grad") else name)
            _prose_metric(facts, name, m.group("v"), n, s, source, m.start("m"))  # "NaN eval loss": eval_loss
        if "first_bad_step" not in facts and (from_start.search(s) or every_step.search(s)):
            for clause in _SENTENCE_END.split(s):
                if ((_FROM_START.search(clause) or (_EVERY_STEP.search(clause) and not _LATER.search(clause)))
                        and _BAD_IN_CLAUSE.search(clause) and not _NORMAL_IN_CLAUSE.search(clause)):
                    facts.set("first_bad_step", 1, "text", n, s, source)
                    break
        if "first_bad_step" not in facts and at_step.search(s):
            for clause in _SENTENCE_END.split(s):
                m = _AT_STEP.search(clause)
                if m and _BAD_IN_CLAUSE.search(clause) and not _NORMAL_IN_CLAUSE.search(clause):
                    step = _step_number(next(g for g in m.groups() if g))
                    if step:
                        facts.set("first_bad_step", step, "text", n, s, source)
                        break
        if lr_fix.search(s):
            facts.add("fix_changes", "learning_rate=lower", "text", n, s, source)
        for m in loss_type.finditer(s):
            if FIX_CUE.search(s[max(0, m.start() - 60):m.end()]) and not _STILL_BAD.search(s[m.end():m.end() + 60]):
                continue  # "switch to IPO loss (loss_type='ipo')": the fix, not the run's loss ("... still nan": it is)
            facts.set("loss_type", (m.group("a") or m.group("b")).lower(), "text", n, s, source)
        if kto_words.search(s) and "algorithm" not in facts:
            facts.set("algorithm", "KTO", "text", n, s, source)
        for rx, sym in symptoms:
            if sym == "zero_loss" and _zero_init(s):
                continue  # `    total_loss = 0`: a script starting its sum, not a loss that reached 0
            hit = next((m for m in rx.finditer(s) if not _SAID_ABSENT.search(before := s[max(0, m.start() - 40):m.start()])
                        and not _EXPECTED_NOT.search(before) and not _ERROR_WORDING.search(before)
                        and not _PREVENTED.search(before)
                        and not (sym == "collapse" and _MAY_CAUSE.search(before))
                        and not (sym in ("nan", "inf") and _ERROR_TAIL.match(s, m.end()))
                        and not _when_it_happens(s, m.start())
                        and not (sym in ("nan", "inf") and (_HARDWARE_FIGURE.search(before)
                                                            or _COUNTED_ZERO.match(s, m.end())))), None)
            if hit is not None and sym == "zero_loss" and _COEFFICIENT_BEFORE.search(s, max(0, hit.start() - 40), hit.start()):
                hit = None  # `weight_soft_loss: 0`: the loss term's weight is set to 0, not a loss that reached 0
            if hit is not None:
                facts.add("symptom", sym, "text", n, s, source)
                if sym == "zero_loss" and re.match(r"loss\b|损失", hit.group(0), re.IGNORECASE) \
                        and not (hit.start() and re.match(r"[A-Za-z0-9_/]", s[hit.start() - 1])) \
                        and not _EVAL_BEFORE.search(s[max(0, hit.start() - 20):hit.start()]):  # (not `pg_loss': 0.0`)
                    facts.add("zero_metrics", "loss", "text", n, s, source)  # "grad_norm总是nan，loss=0"
                if rx is _PAIRWISE_TIE:
                    facts.set("pairwise_tie", True, "text", n, s, source)
        if may_climb and "collapse" not in facts.value("symptom", []) and _climbs_back(s):
            facts.add("symptom", "collapse", "text", n, s, source)
        if "version_evidence" not in facts and version_words.search(s):
            ev = _version_evidence(s)
            if ev:
                facts.set("version_evidence", ev, "text", n, s, source)
    _adapter_of_run(adapters, full, facts, source)


_SET_TO = re.compile(r"\b(?:re)?(?:set|sets|setting|initiali[sz]e[sd]?|initiali[sz]ing|clamp(?:s|ed|ing)?|clip(?:s|ped|ping)?|"
                     r"fill(?:s|ed|ing)?|zero(?:es|ed|ing)? out)\s+(?:the\s+)?(?:[\w/]+\s+)?$", re.IGNORECASE)
_COEFFICIENT_BEFORE = re.compile(r"(?:weight|coef\w*|alpha|beta|lambda|scale)_\w*$", re.IGNORECASE)
# An indented assignment, or one to a compound name, of 0 in a pasted script (the name's shape is checked in
# _zero_init: one character class here keeps the pattern linear).
_ZERO_INIT = re.compile(r"^([ \t]*)([\w.\[\]'\"]+)[ \t]*=[ \t]*0(?:\.0*)?[ \t]*(?:#.*)?$")


def _zero_init(s: str) -> bool:
    m = _ZERO_INIT.match(s) if "=" in s else None
    return m is not None and bool(m.group(1) or re.search(r"[A-Za-z0-9][._]", m.group(2)))


def _compared_ok(s: str, end: int) -> bool:
    """The setting just before `end` is the comparison that trained ("with LoRA trained normally", "LoRA 微调正常")."""
    return bool(WORKED_AFTER.match(s, end) or _TRAINED_TOO.match(s, end))


_SWITCHED = re.compile(r"(?:换|改用)\s*$")


def _switched_to(s: str, start: int) -> bool:
    """The setting at `start` is what the reporter switched to ("换 LoRA 脚本", "switched to LoRA")."""
    return bool(FIX_CUE.search(s[max(0, start - 14):start]) or _SWITCHED.search(s[max(0, start - 4):start]))


def _adapter_of_run(adapters: list[tuple[bool, int, str]], full: list[tuple[bool, int, str]], facts: Facts,
                    source: str) -> None:
    """LoRA or a full fine-tune, from the words. A report that names both usually ran one and compared with the other
    ("full-parameter fine-tuning collapses to 0; the same script with LoRA trained normally", "全量微调报错，LoRA 微调
    正常"): the one said to have trained is the comparison, not the run (issue 11: a setting the reporter tried is
    not the run's). Named alone, LoRA is the run's, whatever follows it ("LoRA 微调 loss 开始正常，后来 nan")."""
    run_lora = [x for x in adapters if not (full and x[0])]
    run_full = [x for x in full if not (adapters and x[0])]
    if run_lora:
        _, n, s = run_lora[0]
        facts.set("use_peft", True, "text", n, s, source)
    elif run_full and "finetuning_type" not in facts:
        _, n, s = run_full[0]
        facts.set("finetuning_type", "full", "text", n, s, source)


# Lightning / litgpt precision strings anywhere in a paste: `--precision 16-true`, `Fabric(precision="bf16-mixed")`,
# "with 16-true precision".
_LIGHTNING = re.compile(r"(?<![\w.\-])(?:(?:bf)?16|32|64)-(?:true|mixed)(?![\w\-])", re.IGNORECASE)


# "loss 陡增后变为 0", "the loss suddenly shot up", "grad_norm spikes": a metric that jumped, said in words.
_NO_BEFORE = re.compile(r"(?:\b(?:no|without|not any|never a)\s+|没有\s*)$", re.IGNORECASE)
_PROSE_SPIKE = re.compile(r"(?<![A-Za-z0-9_/])(?P<m>" + _METRIC_NAME + r"|梯度|损失)(?P<gap>[^\n,，。.;；]{0,40}?)(?:先)?"
                          r"(?:陡增|突增|骤增|骤升|剧增|暴涨|飙升|激增|猛增|突刺|爆炸|急剧(?:上升|增加|增大|升高)|大幅(?:上升|增加)|"
                          r"异常(?:增大|变大|升高|上升)|突然(?:增大|变大|上升|升高)|jump(?:s|ed)? (?:up|sharply)|sho(?:ot|ots|t) up|"
                          # "the loss dramatically rises after an update", "loss rose sharply"
                          r"(?:dramatically|sharply|suddenly|rapidly) (?:rises|rose|increase[sd]|jump(?:s|ed))|"
                          r"(?:rises|rose|increase[sd]|jump(?:s|ed)) (?:dramatically|sharply|steeply)|steep(?:ly)? ris(?:e|es|ing)\b|"
                          r"spik(?:e|es|ed|ing|ey|y)\b|sky-?rocket(?:s|ed|ing)?\b|blow(?:s|n)? up|blew up|explod(?:e|es|ed|ing)|"
                          # "grad_norm eventually starts to spike"
                          r"(?:(?:eventually|gradually|then|later|soon)\s)?(?:starts?|started|begins?|began)\sto\sspike\b|"
                          r"jump(?:s|ed)? by (?:\w+ )?orders? of magnitude)", re.IGNORECASE)
def _spikes(rx: re.Pattern[str], s: str):
    """`rx`'s matches in `s`, except one whose gap holds a contrast ("the loss is fine but the grad_norm spikes"):
    the search goes on from just after that match's metric, so the metric after the contrast is found."""
    pos = 0
    while (m := rx.search(s, pos)) is not None:
        gap = m.group("gap")
        if _CONTRAST.search(gap) or (len(gap) > 20 and re.search(r"[:：=]", gap)):
            pos = m.start() + 1  # (a long gap with a label in it: "normalize_rewards: advantage of the odd sample
            continue             # spikes" is the advantage's spike, not the setting's)
        yield m
        pos = m.end()


# The metric after the word: "sudden huge spikes in the policy loss", "a spike of the grad_norm" (losses, norms and
# KL only: "spikes in the reward" are often just noisy rewards).
_PROSE_SPIKE_REV = re.compile(r"(?<![A-Za-z])(?:spikes?|(?:sudden|dramatic|sharp|huge|steep) (?:increase|rise|jump)) "
                              r"(?:in|of|on) (?:the )?(?:[A-Za-z]+ ){0,2}(?P<gap>)(?P<m>[A-Za-z_/]*"
                              r"(?:loss|norm|kl)(?:es|s)?)(?![A-Za-z0-9_])", re.IGNORECASE)


# "学习率调到 5e-3 后 loss 变成 nan", "with a learning rate of 5e-4": the run's learning rate said in words (a fix cue
# before it, "降到 2e-5 后正常", makes it the setting that worked instead).
_PROSE_LR = re.compile(r"(?:learning[ _]rate|(?<![\w-])lr|学习率)\s*(?:(?:is|was|of|at|set to|to|=|:|：|为|是|设为|设置为|设成|"
                       r"调到|调成|提高到|增大到|改为|改成)|(?=\d(?:\.\d+)?e-\d))\s*(?:(?:代码|脚本|配置|官方)中?的?)?(?:默认的?)?\s*(?P<v>\d+(?:\.\d+)?(?:e-?\d+)?)(?![\w.])", re.IGNORECASE)
# The rest of the clause says that setting worked ("... to 1e-5 and it trains fine", "... 后训练正常").
_WORKED = re.compile(r"[^\n,，。;；]{0,40}?(?:fine(?![- _]?tun)|normal(?!i[sz])|works?\b|worked|stable|solved|converg\w*|正常|好了|解决|稳定|收敛)",
                     re.IGNORECASE)
_NEGATED = re.compile(r"\b(?:not|no|never|n't|without)\b|n't|没有|没|不|未|并非", re.IGNORECASE)


# "lowered the lr and it trained", "After I set different lr for ... the loss becomes normal", "调小学习率后正常".
_LR_FIX = re.compile(r"(?:lr|learning[ _]rate|学习率).{0,40}?(?:降到|降至|降为|调小到|lowered to|reduced to|decreased to|"
                     r"dropped to)\s*[\d.]+(?:e-?\d+)?.{0,30}?(?:normal(?!i[sz])|fine(?![- _]?tun)|work\w*|stable|ok\b|正常|好了|解决)|"
                     r"(?:lower(?:ed|ing)?|smaller|reduc\w*|decreas\w*|different|separate|调小|降低|减小|改小)\s*(?:the\s+)?"
                     r"(?:lr|learning[ _]rate|学习率)(?![a-z]).{0,80}?(?:normal(?!i[sz])|fine(?![- _]?tun)|work\w*|solved|fix\w*|stable|ok\b|正常|好了|解决)|"
                     r"(?:lr|learning[ _]rate|学习率).{0,12}(?:太大|过大|too (?:high|large|big))", re.IGNORECASE)
# Preference-loss variants named in prose or code ("if I use 'ipo'", `loss_type == "ipo"`).
_LOSS_TYPE = re.compile(r"loss_type\s*==\s*['\"](?P<a>\w+)['\"]|\b(?:use|using|with|switch(?:ed)? to)\s+['\"]?"
                        r"(?P<b>ipo|simpo|hinge|sigmoid|kto_pair|robust|exo_pair|nca_pair)['\"]?(?:\s+loss)?\b",
                        re.IGNORECASE)
# Only KTO labels completions desirable / undesirable.
_KTO_WORDS = re.compile(r"\b(?:un)?desir(?:ed|able)\b(?:\s+(?:completions?|examples?|samples?|data))?", re.IGNORECASE)


# The report ties the failure to a release ("peft 降到 0.6.0 后恢复正常", "deepspeed==0.12.2 (bad), 0.11.1 (good)",
# "starting with transformers 4.21.0", "几天前的代码还正常"): the evidence of a framework defect, and where to bisect.
_PKG = (r"(?:torch|pytorch|transformers|trl|peft|deepspeed|accelerate|flash[-_ ]?attn|flash[-_ ]attention|vllm|"
        r"bitsandbytes|unsloth|ms-swift|swift|llama-?factory|verl|openrlhf|xtuner|megatron(?:-lm|-core)?|"
        r"transformer[-_ ]?engine|\bte\b|liger[-_ ]kernel|triton|jax|cuda|cudnn|nccl|apex|paddle(?:paddle|nlp)?|"
        r"mindspore|colossalai|axolotl|torchao|xformers|sglang|nemo|mlx)")
_PKG_RX = re.compile(r"(?<![\w-])" + _PKG + r"(?![\w-])", re.IGNORECASE)
# Starts only where a digit run starts, so a long run of digits is read once, not once per digit.
_VER = r"(?<![\d.])v?(?P<v>\d+\.\d+(?:\.\d+)*(?:\.?(?:post|dev|rc|a|b)\d*)?)(?![\w.])"
# "from 4.45 to 4.46": the version it went to
_FROM = r"(?:from[ \t]+v?\d+(?:\.\d+)+[ \t]+to[ \t]+|从[ \t]*v?\d+(?:\.\d+)+[ \t]*(?:升级|降级|回退)?(?:到|至)[ \t]*)?"
_VERSION_EVIDENCE = (
    # rolled back: "downgraded peft to 0.6.0", "reverting to torch 1.13.1", "回退到 0.5.0 发布版"
    ("rolled back to {}", re.compile(
        r"(?:downgrad\w*|roll(?:ed|ing|s)?[ -]?back|revert(?:ed|ing|s)?|went back|go(?:ing)? back|switch(?:ed|ing)? "
        r"back|pin(?:ned|ning|s)?\b|降级|回退|退回|回滚|换回|装回|(?P<amb>降到|降至|降为|降回))[^\n,，。;；]{0,30}?"
        r"(?:(?P<pkg>" + _PKG + r")[^\n\d,，。;；]{0,12}?)?" + _FROM + _VER, re.IGNORECASE)),
    # "works again with transformers 4.40"
    ("works on {}", re.compile(r"(?:works?|worked|trains? fine(?![- _]?tun)|fine(?![- _]?tun)|normal(?!i[sz])|正常|没问题)[ \t]*(?:again[ \t]*)?"
                               r"(?:on|with|in|under|using|在)[ \t]*(?P<pkg>" + _PKG + r")[ \t]*(?:==|=)?[ \t]*" + _VER,
                               re.IGNORECASE)),
    # "deepspeed==0.12.2 (bad), 0.11.1 (good)", "4.51 则正常", "torch 2.1.0 works"
    ("{}", re.compile(r"(?:(?P<pkg>" + _PKG + r")[ \t]*(?:==|=|:)?[ \t]*)?" + _VER + r"[ \t]*(?:版本)?[ \t]*[(（]?[ \t]*"
                      r"(?:则|就|下|上|里|中)?[ \t]*(?P<ok>good|works?|worked|is fine(?![- _]?tun)|was fine(?![- _]?tun)|fine(?![- _]?tun)|正常|没问题|没有问题|"
                      r"可以|ok\b|bad|broken|fails?|failed|有问题|出问题)", re.IGNORECASE)),
    # "after upgrading DeepSpeed to 0.12.2", "starting with transformers 4.21.0", "升级到 4.36 之后"
    ("changed with the upgrade to {}", re.compile(r"(?:after (?:upgrad|updat|bump)\w*|since (?:upgrad|updat|bump)\w*|starting (?:with|from)|"
                            r"升级|更新)[^\n,，。;；]{0,30}?(?:(?P<pkg>" + _PKG + r")[^\n\d,，。;；]{0,12}?)?" + _FROM + _VER,
                            re.IGNORECASE)),
    # "the previous release works", "几天前的代码还正常"
    ("an older release worked", re.compile(
        r"(?:previous|older|earlier|last|old)\s+(?:version|release|commit|code|build)s?\s*(?:works?|worked|was fine|"
        r"is fine|trains? fine|was ok)|(?:几天前|之前|以前|上一?个|旧|老)(?:的)?(?:代码|版本|commit|发布版)"
        r"[^\n,，。;；]{0,8}?(?:还|都|是|就)?(?:正常|可以|没问题)", re.IGNORECASE)),
)
# Every pattern above needs a version number or an older-release word: lines without one are skipped.
_VERSION_WORDS = re.compile(r"\d\.\d|代码|版本|发布版|commit|version|release|code|build", re.IGNORECASE)
# "... but it is still nan", "降级后依然 nan": the change did not help, so it says nothing about a release.
_STILL = re.compile(r"still|仍|依然|还是|依旧|\bsame\b|没用|无效|不行|no luck|did(?:n't| not) help|does(?:n't| not) help",
                    re.IGNORECASE)
_GOOD_WORDS = ("good", "work", "fine", "正常", "没问题", "没有问题", "可以", "ok")


def _version_evidence(s: str) -> str | None:
    """What `s` says about a release the failure depends on ("rolled back to peft 0.6.0"), or None."""
    for what, rx in _VERSION_EVIDENCE:
        for m in rx.finditer(s):
            labelled = "ok" in rx.groupindex
            if not labelled and _STILL.search(s[m.start(): m.end() + 60].split("\n")[0]):
                continue  # also inside the match: "升级到最新版本还是有这个问题：ms_swift==3.6.0.dev0"
            if "v" not in rx.groupindex:
                return what
            v, pkg = m.group("v"), (m.group("pkg") or "").strip()
            if not pkg:
                # "transformers 4.48 下 loss 不降，4.51 则正常": the package named just before
                before = list(_PKG_RX.finditer(s[max(0, m.start() - 40): m.start()]))
                pkg = before[-1].group(0) if before else ""
            if not pkg and (("amb" in rx.groupindex and m.group("amb")) or (labelled and v.count(".") < 2)):
                continue  # "loss 降到 0.2", "loss 1.5 正常": a metric value, not a release
            if labelled:
                v += " works" if any(w in m.group("ok").lower() for w in _GOOD_WORDS) else " fails"
            return what.format(f"{pkg} {v}" if pkg else v)
    return None


# "evaluation loss is nan", "验证集 loss 为 nan", "验证集上的 loss", "the validation set's loss": the loss named in
# prose is the evaluation loss (a different signal from a training loss that goes bad: all-labels-masked eval
# batches, issue 11's taxonomy).
_EVAL_BEFORE = re.compile(r"(?:(?<![A-Za-z])(?:eval(?:uation)?|validation|val|dev|test)(?:[ _-]?(?:set|split|data(?:set)?)"
                          r"(?:'s)?)?|(?:验证|评估|测试)集?(?:上)?的?)[ _]*$", re.IGNORECASE)


_GRAD_BEFORE = re.compile(r"(?<![A-Za-z])grad(?:ient)?s?[ _-]*$", re.IGNORECASE)


# Metrics a report joins with a slash ("KL/grad_norm", "loss/grad norm"): each its own (a path such as
# `rewards/chosen` or `actor/kl` is one metric).
_PAIRED_METRICS = {"loss": "loss", "kl": "kl", "grad_norm": "grad_norm", "grad norm": "grad_norm", "gnorm": "grad_norm",
                   "reward": "reward", "entropy": "entropy", "lr": "lr"}


def _prose_metric(facts: Facts, name: str, value: str, n: int, s: str, source: str, start: int = -1) -> None:
    if start > 0 and _when_it_happens(s, start):
        return  # "stop training when the loss is NaN", "what happens if the loss becomes 0?": no run reported it
    if start > 0 and _SET_TO.search(s, max(0, start - 24), start):
        return  # "Reset loss to zero on logging": code that sets the value, not a run that reached it
    if start > 0 and _PREVENTED.search(s, max(0, start - 30), start):
        return  # "加了梯度裁剪防止 loss 变成 nan": what a change is meant to prevent, not what happened
    name = name.strip("/").lower()
    if name.endswith(("error", "exception", "warning")):
        return  # "ValueError: nan loss detected": the exception's class, not a metric
    parts = name.split("/")
    if len(parts) > 1 and all(p.strip() in _PAIRED_METRICS for p in parts):
        for p in parts:  # "KL/grad_norm became nan": two metrics named together, not one metric's path
            _prose_metric(facts, _PAIRED_METRICS[p.strip()], value, n, s, source)
        return
    if name == "entropy" and start > 0 and re.search(r"cross[- _]?$", s[max(0, start - 6):start], re.IGNORECASE):
        name = "loss"  # "the perplexity and cross-entropy become NaN": the training loss, not a policy's entropy
    name = {"grand_norm": "grad_norm", "gradnorm": "grad_norm"}.get(name, name)  # a typo, a spelling
    if name == "loss" and start > 0 and _EVAL_BEFORE.search(s[max(0, start - 20):start]):
        name = "eval_loss"
    if name in ("norm", "norms") and start > 0 and _GRAD_BEFORE.search(s[max(0, start - 12):start]):
        name = "grad_norm"  # "grad norm: nan", "the gradient norm is inf", "the actor grad norms were always NaN"
    if is_limit_name(name):
        return  # `max_grad_norm: inf` is a setting
    if name in ("accuracy",):
        name = "acc"
    if name == "nll":
        name = "nll_loss"  # "the NLL term": DPO's auxiliary NLL loss (rpo_alpha) or an SFT NLL
    v = value.lower()
    if v in ("0", "zero", "零") or re.fullmatch(r"0\.0+", v):
        if is_loss_like(name):
            facts.add("zero_metrics", name, "text", n, s, source)
            facts.add("symptom", "zero_loss", "text", n, s, source)
        elif is_grad_norm(name):
            # "grad_norm 一直为 0", "the logged grad_norm was zero": no gradient reaches the weights (a symptom of
            # its own; zero_metrics stays the loss-like metrics that the curated rules reason about).
            facts.add("symptom", "zero_grad", "text", n, s, source)
    else:
        # nan_metrics holds every non-finite metric, as a log record's do; the symptom says which ("loss: inf" is no NaN)
        facts.add("nan_metrics", name, "text", n, s, source)
        facts.add("symptom", "inf" if v.startswith(("inf", "无穷")) else "nan", "text", n, s, source)


def derive(lines: list[tuple[int, str]], facts: Facts, source: str) -> None:
    """Facts that follow from other facts (not from `lines`); their evidence names the facts they came from."""
    # TRL's own issue template (`trl env`: "- TRL version: 0.16.0.dev0" among the versions) with no other training
    # framework named is a TRL run; LLaMA-Factory's and Unsloth's lists carry the same line and name theirs too.
    fw, trl = facts.get("framework"), facts.get("trl_version")
    listed = any(facts.get(k) is not None and facts.get(k).kind == "env" for k in ("transformers_version", "torch_version"))
    if trl is not None and trl.kind == "env" and listed and re.search(r"\bTRL version", trl.detail, re.IGNORECASE) \
            and "finetuning_type" not in facts and (fw is None or (fw.value == "transformers" and fw.kind == "text")):
        facts.items.pop("framework", None)
        facts.set("framework", "trl", "text", trl.line, f"TRL's environment list: {trl.detail}", trl.source)
    # Dynamic loss scaling exists only for fp16: "OVERFLOW! Skipping step" / "loss scale already at minimum"
    # says the run is fp16 even when the paste never names its dtype.
    if "precision" not in facts:
        for eid in ("loss_scale_min", "ds_overflow"):
            ev = facts.evidence_for("errors", eid)
            if ev is not None and eid in facts.value("errors", []):
                facts.set("precision", "fp16", "log", ev.line, f"fp16 loss scaling: {ev.detail}", ev.source)
                break
    gpu = facts.get("gpu")
    if gpu is not None and "gpu_bf16" not in facts:  # a GPU named in a sentence: can it train in bf16?
        facts.set("gpu_bf16", not GPU_WITHOUT_BF16.search(str(gpu.value)), gpu.kind, gpu.line, gpu.detail, gpu.source)
    sp = facts.get("sequence_parallel_size")
    if sp is not None and isinstance(sp.value, int) and sp.value > 1:
        facts.set("sequence_parallel", True, sp.kind, sp.line, sp.detail, sp.source)
    mp, ml = facts.get("max_prompt_length"), facts.get("max_length")
    if mp is not None and ml is not None:
        try:
            if float(mp.value) >= float(ml.value):
                facts.set("prompt_exceeds_max_length", True, mp.kind, mp.line,
                          f"max_prompt_length {mp.value} >= max_length {ml.value}", mp.source)
        except (TypeError, ValueError):
            pass
    # verl spreads ppo_mini_batch_size * rollout.n sequences over the data-parallel ranks; a per-GPU micro-batch
    # above that share makes its gradient accumulation (mini // micro) 0.
    mini, n, gpus = facts.get("mini_batch_size"), facts.get("num_generations"), facts.get("num_gpus")
    if mini is not None and n is not None and gpus is not None and "per_gpu_mini_batch_size" not in facts:
        try:
            dp = int(gpus.value) * int(facts.value("num_nodes") or 1) \
                // max(1, int(facts.value("sequence_parallel_size") or 1))
            per_gpu = int(mini.value) * int(n.value) // max(1, dp)
        except (TypeError, ValueError):
            pass
        else:
            facts.set("per_gpu_mini_batch_size", per_gpu, mini.kind, mini.line,
                      f"mini_batch_size {mini.value} x rollout.n {n.value} / {max(1, dp)} data-parallel ranks",
                      mini.source)
    fixes = facts.value("fix_changes", [])
    prec = facts.get("precision")
    if ("weights_dtype" not in facts and prec is not None and prec.value == "fp16"
            and any(str(x).startswith("weights_dtype=") for x in fixes)):
        ev = facts.evidence_for("fix_changes")
        facts.set("weights_dtype", "fp16", "text", prec.line,
                  f"{prec.detail} / the fix changed the model's torch_dtype: {ev.detail if ev else ''}", prec.source)
