"""A generated English→German corpus for the built-in demo.

WMT14 is far too big for a 2-core CPU, so the demo trains on sentences drawn from a small
grammar instead. Each sentence is first sampled as an abstract structure (`Sentence`, built
from `Clause` and `NounPhrase`), then rendered twice: `render_english` and `translate`
(German). The German is therefore a deterministic function of the structure, and the
grammar avoids English ambiguities that would need two German renderings, so near-perfect
BLEU is reachable; yet the German differs from the English in the ways that make
translation need attention (Vaswani et al., 2017, §1):

* grammatical gender and case: der/den/dem alte(n) Mann, ein/einen/einem, weak nouns
  (den Jungen), dative plurals (den Kindern), preposition contractions (im, zum, ins);
* word order: verb-second after a fronted adverbial or subordinate clause, verb-final
  subordinate and relative clauses, participles, infinitives and separable prefixes at
  the end of the clause (hat ... gesehen, kann ... sehen, ruft ... an);
* negation as "nicht" or "kein", dative verbs (hilft dem Kind), prepositional objects
  (wartet auf den Bus), adverbs before objects (sieht heute den Hund).

Deviation from real data: the semantics is only roughly plausible (an elephant may read
a newspaper), and the English is in a restricted register (no pronouns, no "you").
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import hashlib
import json
import os
import random
import re
import tempfile
import time
from typing import Iterable, Sequence

# Bump whenever the grammar or lexicon changes: cached corpora are then regenerated.
GENERATOR_VERSION = 1

CASES = ('nom', 'acc', 'dat')

# ---------------------------------------------------------------------------------------
# Lexicon. Columns are separated by '|'; tags by ','. Kept as tables so that a reader can
# check the German at a glance.
# ---------------------------------------------------------------------------------------

# english singular | english plural | gender | German singular | German plural | tags
# [| weak-noun form for acc/dat singular].  '-' plural: a mass noun (never plural, no "a").
# Tags: the category (person, animal, thing, food, drink, vehicle, place, song), what a
# verb may take as object (small, read, write, open, ...), which prepositions fit
# (in/into/on/onto/under/near/at/to/through/across), and colour tags for adjectives.
_NOUN_TABLE = """
man|men|m|Mann|Männer|person,near,to
woman|women|f|Frau|Frauen|person,near,to
child|children|n|Kind|Kinder|person,near,to,wash
boy|boys|m|Junge|Jungen|person,near,to|Jungen
girl|girls|n|Mädchen|Mädchen|person,near,to
teacher|teachers|m|Lehrer|Lehrer|person,near,to
doctor|doctors|m|Arzt|Ärzte|person,near,to
student|students|m|Student|Studenten|person,near,to|Studenten
neighbour|neighbours|m|Nachbar|Nachbarn|person,near,to|Nachbarn
farmer|farmers|m|Bauer|Bauern|person,near,to|Bauern
king|kings|m|König|Könige|person,near,to
queen|queens|f|Königin|Königinnen|person,near,to
friend|friends|m|Freund|Freunde|person,near,to
mother|mothers|f|Mutter|Mütter|person,near,to
father|fathers|m|Vater|Väter|person,near,to
brother|brothers|m|Bruder|Brüder|person,near,to
sister|sisters|f|Schwester|Schwestern|person,near,to
son|sons|m|Sohn|Söhne|person,near,to
daughter|daughters|f|Tochter|Töchter|person,near,to
grandmother|grandmothers|f|Großmutter|Großmütter|person,near,to
grandfather|grandfathers|m|Großvater|Großväter|person,near,to
baby|babies|n|Baby|Babys|person,near,to,wash
police officer|police officers|m|Polizist|Polizisten|person,near,to|Polizisten
driver|drivers|m|Fahrer|Fahrer|person,near,to
waiter|waiters|m|Kellner|Kellner|person,near,to
nurse|nurses|f|Krankenschwester|Krankenschwestern|person,near,to
pupil|pupils|m|Schüler|Schüler|person,near,to
dog|dogs|m|Hund|Hunde|animal,near,to,fur,wash
cat|cats|f|Katze|Katzen|animal,near,to,fur,wash,smallanimal
horse|horses|n|Pferd|Pferde|animal,near,to,fur,wash
bird|birds|m|Vogel|Vögel|animal,bird,near,fur,smallanimal
mouse|mice|f|Maus|Mäuse|animal,near,fur,smallanimal
cow|cows|f|Kuh|Kühe|animal,near,to,fur
bear|bears|m|Bär|Bären|animal,near,to,fur|Bären
lion|lions|m|Löwe|Löwen|animal,near,to|Löwen
monkey|monkeys|m|Affe|Affen|animal,near,to,fur|Affen
fox|foxes|m|Fuchs|Füchse|animal,near,fur
duck|ducks|f|Ente|Enten|animal,bird,near,smallanimal
rabbit|rabbits|n|Kaninchen|Kaninchen|animal,near,fur,smallanimal
pig|pigs|n|Schwein|Schweine|animal,near,to,wash
donkey|donkeys|m|Esel|Esel|animal,near,to,fur
goat|goats|f|Ziege|Ziegen|animal,near,to,fur
wolf|wolves|m|Wolf|Wölfe|animal,near,fur
elephant|elephants|m|Elefant|Elefanten|animal,near,to,wash|Elefanten
ball|balls|m|Ball|Bälle|thing,small,ball,col
book|books|n|Buch|Bücher|thing,small,read,write,open,send,col,long
letter|letters|m|Brief|Briefe|thing,small,read,write,open,send,long
newspaper|newspapers|f|Zeitung|Zeitungen|thing,small,read
key|keys|m|Schlüssel|Schlüssel|thing,small
bag|bags|f|Tasche|Taschen|thing,small,open,container,col
hat|hats|m|Hut|Hüte|thing,small,col
flower|flowers|f|Blume|Blumen|thing,small,col,send
picture|pictures|n|Bild|Bilder|thing,small,send,picture
gift|gifts|n|Geschenk|Geschenke|thing,small,open,send
bottle|bottles|f|Flasche|Flaschen|thing,small,open,container,wash
cup|cups|f|Tasse|Tassen|thing,small,container,wash,col
glass|glasses|n|Glas|Gläser|thing,small,container,wash
box|boxes|f|Kiste|Kisten|thing,small,open,container,build,col
lamp|lamps|f|Lampe|Lampen|thing,small,col,near
clock|clocks|f|Uhr|Uhren|thing,small
knife|knives|n|Messer|Messer|thing,small,wash
spoon|spoons|m|Löffel|Löffel|thing,small,wash
plate|plates|m|Teller|Teller|thing,small,wash
candle|candles|f|Kerze|Kerzen|thing,small,col
map|maps|f|Karte|Karten|thing,small,read
computer|computers|m|Computer|Computer|thing,small
phone|phones|n|Telefon|Telefone|thing,small
umbrella|umbrellas|m|Regenschirm|Regenschirme|thing,small,col
stone|stones|m|Stein|Steine|thing,small
chair|chairs|m|Stuhl|Stühle|thing,on,onto,under,near,build,clean,col
table|tables|m|Tisch|Tische|thing,on,onto,under,near,at,build,clean,col
bed|beds|n|Bett|Betten|thing,on,onto,under,near
window|windows|n|Fenster|Fenster|thing,open,near,at,clean,to
door|doors|f|Tür|Türen|thing,open,near,at,col,to
apple|apples|m|Apfel|Äpfel|food
cake|cakes|m|Kuchen|Kuchen|food
egg|eggs|n|Ei|Eier|food,cook
banana|bananas|f|Banane|Bananen|food
potato|potatoes|f|Kartoffel|Kartoffeln|food,cook
soup|soups|f|Suppe|Suppen|food,cook
pear|pears|f|Birne|Birnen|food
carrot|carrots|f|Karotte|Karotten|food
bread|-|n|Brot|-|food,mass
cheese|-|m|Käse|-|food,mass
rice|-|m|Reis|-|food,mass,cook
water|-|n|Wasser|-|drink,mass
milk|-|f|Milch|-|drink,mass
coffee|-|m|Kaffee|-|drink,mass,cook
tea|-|m|Tee|-|drink,mass,cook
juice|-|m|Saft|-|drink,mass
car|cars|n|Auto|Autos|vehicle,in,into,near,to,wash,clean,col
bus|buses|m|Bus|Busse|vehicle,transport,in,into,near,col
train|trains|m|Zug|Züge|vehicle,transport,in,into,near,col,long
boat|boats|n|Boot|Boote|vehicle,in,into,near,build,col
bicycle|bicycles|n|Fahrrad|Fahrräder|vehicle,near,wash,col
ship|ships|n|Schiff|Schiffe|vehicle,transport,near,col
park|parks|m|Park|Parks|place,in,into,to,through,visit
garden|gardens|m|Garten|Gärten|place,in,into,through
house|houses|n|Haus|Häuser|place,in,into,near,through,build,clean,tidy,col
school|schools|f|Schule|Schulen|place,in,into,near,to,visit
kitchen|kitchens|f|Küche|Küchen|place,in,into,clean,tidy
room|rooms|n|Zimmer|Zimmer|place,in,into,clean,tidy,container
city|cities|f|Stadt|Städte|place,in,into,through,visit
forest|forests|m|Wald|Wälder|place,in,into,through
village|villages|n|Dorf|Dörfer|place,in,into,through,visit
street|streets|f|Straße|Straßen|place,on,onto,through,across,long
station|stations|m|Bahnhof|Bahnhöfe|place,in,into,near,at,to
bridge|bridges|f|Brücke|Brücken|place,on,onto,under,across,to,build,long
church|churches|f|Kirche|Kirchen|place,in,into,near,to,visit
market|markets|m|Markt|Märkte|place,to
river|rivers|m|Fluss|Flüsse|place,into,at,to,across,long
lake|lakes|m|See|Seen|place,into,at,to
library|libraries|f|Bibliothek|Bibliotheken|place,in,into,near,to,visit
hospital|hospitals|n|Krankenhaus|Krankenhäuser|place,in,into,near,to
museum|museums|n|Museum|Museen|place,in,into,near,to,visit
office|offices|n|Büro|Büros|place,in,into,to,clean,tidy
shop|shops|m|Laden|Läden|place,in,into,near,to
restaurant|restaurants|n|Restaurant|Restaurants|place,in,into,near,to
hotel|hotels|n|Hotel|Hotels|place,in,into,near,to
square|squares|m|Platz|Plätze|place,on,across
field|fields|n|Feld|Felder|place,on,onto,through,across
mountain|mountains|m|Berg|Berge|place,on
beach|beaches|m|Strand|Strände|place,at,to
farm|farms|m|Bauernhof|Bauernhöfe|place,on,to,visit
roof|roofs|n|Dach|Dächer|place,on,onto,col
tree|trees|m|Baum|Bäume|place,under,near,to
song|songs|n|Lied|Lieder|song,write,long
"""

# Proper names take no article and do not decline; they are never plural.
_NAMES = {'Anna': 'f', 'Maria': 'f', 'Lisa': 'f', 'Peter': 'm', 'Thomas': 'm', 'Paul': 'm'}

# english | German predicative | German attributive stem | English order class
# (opinion 0 < size 1 < age 2 < colour 3) | may take "very" | noun tags it fits
_ADJECTIVE_TABLE = """
good|gut|gut|0|y|person,animal,food,thing
beautiful|schön|schön|0|y|person,animal,thing,place,vehicle
friendly|freundlich|freundlich|0|y|person,animal
clever|klug|klug|0|y|person,animal
lazy|faul|faul|0|y|person,animal
famous|berühmt|berühmt|0|y|person,place
strange|seltsam|seltsam|0|y|person,animal,thing,place,vehicle,song
dangerous|gefährlich|gefährlich|0|y|animal,place,vehicle
expensive|teuer|teur|0|y|thing,vehicle,food,drink
cheap|billig|billig|0|y|thing,vehicle,food,drink
dirty|schmutzig|schmutzig|0|y|person,animal,thing,vehicle,place
clean|sauber|sauber|0|y|thing,vehicle,place
tired|müde|müd|0|y|person,animal
hungry|hungrig|hungrig|0|y|person,animal
happy|glücklich|glücklich|0|y|person,animal
sad|traurig|traurig|0|y|person,animal,song
angry|wütend|wütend|0|y|person,animal
loud|laut|laut|0|y|person,animal,vehicle,song
quiet|leise|leis|0|y|person,animal
heavy|schwer|schwer|0|y|thing
empty|leer|leer|0|y|container,place,vehicle
fast|schnell|schnell|0|y|animal,vehicle
slow|langsam|langsam|0|y|animal,vehicle
wet|nass|nass|0|y|person,animal,thing
warm|warm|warm|0|y|food,drink,place
cold|kalt|kalt|0|y|food,drink,place
fresh|frisch|frisch|0|y|food,drink
big|groß|groß|1|y|person,animal,thing,vehicle,place
small|klein|klein|1|y|person,animal,thing,vehicle,place
long|lang|lang|1|y|long
short|kurz|kurz|1|y|long
old|alt|alt|2|y|person,animal,thing,vehicle,place,song
young|jung|jung|2|y|person,animal
new|neu|neu|2|y|person,thing,vehicle,place,song
red|rot|rot|3|n|col
blue|blau|blau|3|n|col
green|grün|grün|3|n|col
yellow|gelb|gelb|3|n|col
black|schwarz|schwarz|3|n|col,fur
brown|braun|braun|3|n|col,fur
grey|grau|grau|3|n|col,fur
"""

# key | english base,3sg,participle | German infinitive (a '+' marks a separable
# prefix),3sg,3pl,participle | perfect auxiliary (h=haben, s=sein) | frame | subject tags
# | object tags | recipient tags (ditransitive) | prepositional phrases | flags.
# Frames: acc/dat object, ditr (dative recipient + accusative), auf.acc etc. (a
# prepositional object), intr, cop (copula), that (takes a dass-clause).
# PP groups: loc (in on under behind 'in front of' 'next to' at), with (with, without),
# for, dir (into to through across), or single prepositions.
# Flags: opt = object optional, pres = present tense only, nomod = no modal verb.
_VERB_TABLE = """
see|see,sees,seen|sehen,sieht,sehen,gesehen|h|acc|person,animal|person,animal,thing,food,vehicle,place|-|loc,with|
find|find,finds,found|finden,findet,finden,gefunden|h|acc|person,animal|small,animal,food|-|loc,with|
buy|buy,buys,bought|kaufen,kauft,kaufen,gekauft|h|acc|person|small,food,drink,vehicle,animal|-|loc,with,for|
sell|sell,sells,sold|verkaufen,verkauft,verkaufen,verkauft|h|acc|person|small,food,vehicle,animal|-|loc,with|
read|read,reads,read|lesen,liest,lesen,gelesen|h|acc|person|read|-|loc,with,for|opt
write|write,writes,written|schreiben,schreibt,schreiben,geschrieben|h|acc|person|write|-|loc,with,for|opt
eat|eat,eats,eaten|essen,isst,essen,gegessen|h|acc|person,animal|food|-|loc,with|opt
drink|drink,drinks,drunk|trinken,trinkt,trinken,getrunken|h|acc|person,animal|drink|-|loc,with|opt
like|like,likes,liked|mögen,mag,mögen,gemocht|h|acc|person,animal|person,animal,thing,food,drink,place,song|-|-|nomod
love|love,loves,loved|lieben,liebt,lieben,geliebt|h|acc|person|person,animal,place,song|-|-|nomod
visit|visit,visits,visited|besuchen,besucht,besuchen,besucht|h|acc|person|person,visit|-|with|
need|need,needs,needed|brauchen,braucht,brauchen,gebraucht|h|acc|person,animal|small,food,drink,vehicle|-|-|nomod
hold|hold,holds,held|halten,hält,halten,gehalten|h|acc|person|small,smallanimal|-|loc|
carry|carry,carries,carried|tragen,trägt,tragen,getragen|h|acc|person|small,smallanimal|-|loc,dir|
open|open,opens,opened|öffnen,öffnet,öffnen,geöffnet|h|acc|person|open|-|loc|
close|close,closes,closed|schließen,schließt,schließen,geschlossen|h|acc|person|open|-|loc|
wash|wash,washes,washed|waschen,wäscht,waschen,gewaschen|h|acc|person|wash|-|loc,with|
paint|paint,paints,painted|malen,malt,malen,gemalt|h|acc|person|person,animal,thing,vehicle,place|-|loc,with,for|opt
catch|catch,catches,caught|fangen,fängt,fangen,gefangen|h|acc|person,animal|smallanimal,ball|-|loc|
look for|look for,looks for,looked for|suchen,sucht,suchen,gesucht|h|acc|person,animal|small,animal,person|-|loc,with|
lose|lose,loses,lost|verlieren,verliert,verlieren,verloren|h|acc|person|small|-|loc|
cook|cook,cooks,cooked|kochen,kocht,kochen,gekocht|h|acc|person|cook|-|loc,with,for|opt
build|build,builds,built|bauen,baut,bauen,gebaut|h|acc|person|build|-|loc,with,for|
hear|hear,hears,heard|hören,hört,hören,gehört|h|acc|person,animal|person,animal,song,vehicle|-|loc|
know|know,knows,known|kennen,kennt,kennen,gekannt|h|acc|person|person,visit,song,animal|-|-|nomod
forget|forget,forgets,forgotten|vergessen,vergisst,vergessen,vergessen|h|acc|person|small,person,song|-|loc|
take|take,takes,taken|nehmen,nimmt,nehmen,genommen|h|acc|person|small,food|-|-|
clean|clean,cleans,cleaned|putzen,putzt,putzen,geputzt|h|acc|person|clean|-|with|
order|order,orders,ordered|bestellen,bestellt,bestellen,bestellt|h|acc|person|food,drink|-|loc,for|
feed|feed,feeds,fed|füttern,füttert,füttern,gefüttert|h|acc|person|animal|-|loc,with|
call|call,calls,called|an+rufen,ruft,rufen,angerufen|h|acc|person|person|-|-|
invite|invite,invites,invited|ein+laden,lädt,laden,eingeladen|h|acc|person|person|-|-|
pick up|pick up,picks up,picked up|ab+holen,holt,holen,abgeholt|h|acc|person|person,small|-|loc|
tidy up|tidy up,tidies up,tidied up|auf+räumen,räumt,räumen,aufgeräumt|h|acc|person|tidy|-|with|
look at|look at,looks at,looked at|an+schauen,schaut,schauen,angeschaut|h|acc|person,animal|person,animal,thing,vehicle,place|-|loc|
give|give,gives,given|geben,gibt,geben,gegeben|h|ditr|person|small,food|person,animal|loc|
show|show,shows,shown|zeigen,zeigt,zeigen,gezeigt|h|ditr|person|small,animal|person|loc|
bring|bring,brings,brought|bringen,bringt,bringen,gebracht|h|ditr|person|small,food,drink|person|-|
send|send,sends,sent|schicken,schickt,schicken,geschickt|h|ditr|person|send|person|-|
help|help,helps,helped|helfen,hilft,helfen,geholfen|h|dat|person,animal|person,animal|-|loc|
thank|thank,thanks,thanked|danken,dankt,danken,gedankt|h|dat|person|person|-|-|
follow|follow,follows,followed|folgen,folgt,folgen,gefolgt|s|dat|person,animal|person,animal|-|dir|
answer|answer,answers,answered|antworten,antwortet,antworten,geantwortet|h|dat|person|person|-|-|
belong to|belong to,belongs to,belonged to|gehören,gehört,gehören,gehört|h|dat|small,animal,vehicle|person|-|-|pres
wait for|wait for,waits for,waited for|warten,wartet,warten,gewartet|h|auf.acc|person,animal|person,animal,vehicle|-|loc|
think of|think of,thinks of,thought of|denken,denkt,denken,gedacht|h|an.acc|person|person,animal,place,small|-|-|
talk about|talk about,talks about,talked about|sprechen,spricht,sprechen,gesprochen|h|über.acc|person|person,animal,read,place,song|-|loc,with|
sing|sing,sings,sung|singen,singt,singen,gesungen|h|acc|person,bird|song|-|loc,with,for|opt
sleep|sleep,sleeps,slept|schlafen,schläft,schlafen,geschlafen|h|intr|person,animal|-|-|loc|
laugh|laugh,laughs,laughed|lachen,lacht,lachen,gelacht|h|intr|person|-|-|in,on,under,behind,in front of,next to,with|
work|work,works,worked|arbeiten,arbeitet,arbeiten,gearbeitet|h|intr|person|-|-|loc,with,for|
play|play,plays,played|spielen,spielt,spielen,gespielt|h|intr|person,animal|-|-|loc,with|
dance|dance,dances,danced|tanzen,tanzt,tanzen,getanzt|h|intr|person|-|-|loc,with|
sit|sit,sits,sat|sitzen,sitzt,sitzen,gesessen|h|intr|person,animal|-|-|loc,with|
stand|stand,stands,stood|stehen,steht,stehen,gestanden|h|intr|person,animal,vehicle|-|-|loc|
cry|cry,cries,cried|weinen,weint,weinen,geweint|h|intr|person|-|-|in,on,under,behind,in front of,next to|
stay|stay,stays,stayed|bleiben,bleibt,bleiben,geblieben|s|intr|person,animal|-|-|loc,with|
arrive|arrive,arrives,arrived|an+kommen,kommt,kommen,angekommen|s|intr|person,transport|-|-|in,at|
get up|get up,gets up,got up|auf+stehen,steht,stehen,aufgestanden|s|intr|person|-|-|-|
go|go,goes,gone|gehen,geht,gehen,gegangen|s|intr|person,animal|-|-|dir,with|
run|run,runs,run|laufen,läuft,laufen,gelaufen|s|intr|person,animal|-|-|dir,onto,with|
drive|drive,drives,driven|fahren,fährt,fahren,gefahren|s|intr|person|-|-|dir,with|
fly|fly,flies,flown|fliegen,fliegt,fliegen,geflogen|s|intr|bird|-|-|dir,onto|
come|come,comes,come|kommen,kommt,kommen,gekommen|s|intr|person,animal|-|-|dir,from,with|
jump|jump,jumps,jumped|springen,springt,springen,gesprungen|s|intr|person,animal|-|-|dir,onto|
be|be,is,been|sein,ist,sind,gewesen|s|cop|person,animal,thing,food,drink,vehicle,place|-|-|loc|nomod
say that|say,says,said|sagen,sagt,sagen,gesagt|h|that|person|-|-|-|nomod
think that|think,thinks,thought|denken,denkt,denken,gedacht|h|that|person|-|-|-|nomod
know that|know,knows,known|wissen,weiß,wissen,gewusst|h|that|person|-|-|-|nomod
hope that|hope,hopes,hoped|hoffen,hofft,hoffen,gehofft|h|that|person|-|-|-|nomod
"""

# english preposition -> (German, case, noun tags the object must have)
PREPOSITIONS = {
    'in': ('in', 'dat', ('in',)),
    'on': ('auf', 'dat', ('on',)),
    'under': ('unter', 'dat', ('under',)),
    'behind': ('hinter', 'dat', ('near',)),
    'in front of': ('vor', 'dat', ('near',)),
    'next to': ('neben', 'dat', ('near',)),
    'at': ('an', 'dat', ('at',)),
    'with': ('mit', 'dat', ('person', 'animal')),
    'without': ('ohne', 'acc', ('person', 'animal')),
    'for': ('für', 'acc', ('person',)),
    'into': ('in', 'acc', ('into',)),
    'onto': ('auf', 'acc', ('onto',)),
    'to': ('zu', 'dat', ('to',)),
    'through': ('durch', 'acc', ('through',)),
    'across': ('über', 'acc', ('across',)),
    'from': ('von', 'dat', ('to',)),
}
_PP_GROUPS = {
    'loc': ('in', 'on', 'under', 'behind', 'in front of', 'next to', 'at'),
    'with': ('with', 'without'),
    'dir': ('into', 'to', 'through', 'across'),
}
# Directional PPs and prepositional objects are complements: "nicht" precedes them.
DIRECTIONAL = frozenset({'into', 'onto', 'to', 'through', 'across', 'from'})
# Standard German fuses these prepositions with the definite article.
_CONTRACTIONS = {('in', 'dem'): 'im', ('in', 'das'): 'ins', ('an', 'dem'): 'am',
                 ('zu', 'dem'): 'zum', ('zu', 'der'): 'zur', ('von', 'dem'): 'vom'}

# english -> (German, kind). time_* adverbs go clause-final in English, freq ones before
# the main verb; both go right after the subject in the German middle field. No
# "yesterday": the English present perfect, which renders the Perfekt, rejects it.
ADVERBS = {
    'today': ('heute', 'time_any'), 'tomorrow': ('morgen', 'time_future'),
    'now': ('jetzt', 'time_future'),
    'often': ('oft', 'freq'), 'sometimes': ('manchmal', 'freq'),
    'usually': ('meistens', 'freq'), 'always': ('immer', 'freq'),
}
# "Always the man sees the dog" is not idiomatic English.
_UNFRONTABLE = frozenset({'always'})

# english modal -> German (3sg, plural); "want" renders as "wants to"
MODALS = {'can': ('kann', 'können'), 'must': ('muss', 'müssen'), 'want': ('will', 'wollen')}

# key -> (english singular, english plural, German stem, declension kind). der-words take
# the strong endings and leave adjectives weak; ein-words take the strong endings only
# where they have an ending of their own; quantifiers (viele, einige) decline strongly
# and, like a bare noun, leave adjectives strong too.
DETERMINERS = {
    'the': ('the', 'the', '', 'def'),
    'this': ('this', 'these', 'dies', 'derword'),
    'every': ('every', None, 'jed', 'derword'),
    'a': ('a', None, 'ein', 'einword'),
    'no': ('no', 'no', 'kein', 'einword'),
    'my': ('my', 'my', 'mein', 'einword'),
    'our': ('our', 'our', 'unser', 'einword'),
    'his': ('his', 'his', 'sein', 'einword'),
    'her': ('her', 'her', 'ihr', 'einword'),
    'many': (None, 'many', 'viel', 'quantifier'),
    'some': (None, 'some', 'einig', 'quantifier'),
    'bare': ('', '', '', 'none'),
    'name': ('', None, '', 'none'),
}
NUMBERS = {'two': 'zwei', 'three': 'drei', 'four': 'vier', 'five': 'fünf', 'six': 'sechs',
           'seven': 'sieben', 'eight': 'acht', 'nine': 'neun', 'ten': 'zehn'}
for _en in NUMBERS:
  DETERMINERS[_en] = (None, _en, NUMBERS[_en], 'none')

CONJUNCTIONS = {'and': 'und', 'or': 'oder', 'but': 'aber'}
SUBORDINATORS = {'because': 'weil', 'although': 'obwohl', 'when': 'wenn', 'while': 'während'}

# Inflection tables, indexed [gender or 'p'][case index].
_DER = {'m': ('der', 'den', 'dem'), 'f': ('die', 'die', 'der'), 'n': ('das', 'das', 'dem'),
        'p': ('die', 'die', 'den')}
_STRONG = {'m': ('er', 'en', 'em'), 'f': ('e', 'e', 'er'), 'n': ('es', 'es', 'em'),
           'p': ('e', 'e', 'en')}
_WEAK = {'m': ('e', 'en', 'en'), 'f': ('e', 'e', 'en'), 'n': ('e', 'e', 'en'),
         'p': ('en', 'en', 'en')}
_EIN = {'m': ('', 'en', 'em'), 'f': ('e', 'e', 'er'), 'n': ('', '', 'em'),
        'p': ('e', 'e', 'en')}
_RELATIVE = {'m': ('der', 'den', 'dem'), 'f': ('die', 'die', 'der'),
             'n': ('das', 'das', 'dem'), 'p': ('die', 'die', 'denen')}


@dataclasses.dataclass(frozen=True)
class Noun:
  """A noun with its English and German forms; `de_weak` is set for n-declension nouns."""
  en: str
  en_pl: str | None
  gender: str  # 'm', 'f' or 'n'
  de: str
  de_pl: str | None
  tags: frozenset[str]
  de_weak: str | None = None

  def german(self, case: str, plural: bool) -> str:
    """The German form: dative plurals add -n, weak nouns add -(e)n outside the nominative."""
    if plural:
      if case == 'dat' and not self.de_pl.endswith(('n', 's')):
        return self.de_pl + 'n'
      return self.de_pl
    if self.de_weak and case != 'nom':
      return self.de_weak
    return self.de


@dataclasses.dataclass(frozen=True)
class Adjective:
  en: str
  de: str  # predicative form
  de_stem: str  # attributive stem, before the ending
  order: int  # English adjective order class
  gradable: bool
  tags: frozenset[str]


@dataclasses.dataclass(frozen=True)
class Verb:
  """A verb with its English and German forms and the frame it is used in."""
  key: str
  en: str
  en_3sg: str
  en_part: str
  de_inf: str
  de_3sg: str  # without a separable prefix
  de_pl: str
  de_part: str
  prefix: str  # separable prefix, '' if none
  aux: str  # 'haben' or 'sein'
  frame: str
  subj: frozenset[str]
  obj: frozenset[str]
  recipient: frozenset[str]
  pps: tuple[str, ...]
  flags: frozenset[str]

  @property
  def object_case(self) -> str | None:
    """The case of the (non-recipient) object, or None without an NP object."""
    if self.frame in ('acc', 'ditr'):
      return 'acc'
    if self.frame == 'dat':
      return 'dat'
    if '.' in self.frame:
      return self.frame.split('.')[1]
    return None


def _parse_nouns(table: str) -> dict[str, Noun]:
  nouns = {}
  for line in table.strip().splitlines():
    en, en_pl, gender, de, de_pl, tags, *weak = line.split('|')
    nouns[en] = Noun(en=en, en_pl=None if en_pl == '-' else en_pl, gender=gender, de=de,
                     de_pl=None if de_pl == '-' else de_pl, tags=frozenset(tags.split(',')),
                     de_weak=weak[0] if weak else None)
  for name, gender in _NAMES.items():
    nouns[name] = Noun(name, None, gender, name, None,
                       frozenset({'person', 'name', 'near', 'to'}))
  return nouns


def _parse_adjectives(table: str) -> dict[str, Adjective]:
  adjectives = {}
  for line in table.strip().splitlines():
    en, de, stem, order, gradable, tags = line.split('|')
    adjectives[en] = Adjective(en, de, stem, int(order), gradable == 'y',
                               frozenset(tags.split(',')))
  return adjectives


def _tagset(field: str) -> frozenset[str]:
  return frozenset() if field == '-' else frozenset(field.split(','))


def _parse_verbs(table: str) -> dict[str, Verb]:
  verbs = {}
  for line in table.strip().splitlines():
    key, en, de, aux, frame, subj, obj, recipient, pps, flags = line.split('|')
    en_base, en_3sg, en_part = en.split(',')
    de_inf, de_3sg, de_pl, de_part = de.split(',')
    prefix = de_inf.split('+')[0] if '+' in de_inf else ''
    pp_list = []
    for group in ([] if pps == '-' else pps.split(',')):
      pp_list.extend(_PP_GROUPS.get(group, (group,)))
    verbs[key] = Verb(key, en_base, en_3sg, en_part, de_inf.replace('+', ''), de_3sg, de_pl,
                      de_part, prefix, 'sein' if aux == 's' else 'haben', frame,
                      _tagset(subj), _tagset(obj), _tagset(recipient), tuple(pp_list),
                      frozenset(flags.split(',')) - {''})
  return verbs


NOUNS = _parse_nouns(_NOUN_TABLE)
ADJECTIVES = _parse_adjectives(_ADJECTIVE_TABLE)
VERBS = _parse_verbs(_VERB_TABLE)


# ---------------------------------------------------------------------------------------
# Abstract structure.
# ---------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class NounPhrase:
  """Determiner, adjectives and noun; optionally a relative clause (`Clause` with a gap)."""
  noun: str  # a key of NOUNS
  det: str = 'the'  # a key of DETERMINERS
  plural: bool = False
  adjectives: tuple[str, ...] = ()
  very: bool = False  # "very" before the first adjective
  relative: Clause | None = None


@dataclasses.dataclass(frozen=True)
class PrepPhrase:
  prep: str  # a key of PREPOSITIONS
  np: NounPhrase


@dataclasses.dataclass(frozen=True)
class Clause:
  """One clause. In a relative clause, `subject` (subject gap) or `obj` (object gap) is None.

  `obj` is the accusative, dative or prepositional object as the verb's frame says;
  `recipient` the dative of a ditransitive verb. A copula clause has `predicate` (an
  adjective key) or a locative `pp`. `complement` is the dass-clause of a 'that' verb.
  """
  subject: NounPhrase | None
  verb: str  # a key of VERBS
  obj: NounPhrase | None = None
  recipient: NounPhrase | None = None
  to_recipient: bool = False  # English "gives the book to the child"
  predicate: str | None = None
  very: bool = False  # "very" before the predicate adjective
  pp: PrepPhrase | None = None
  tense: str = 'present'  # 'present' or 'perfect'
  modal: str | None = None  # a key of MODALS
  negated: bool = False
  adverb: str | None = None  # a key of ADVERBS
  fronted: bool = False  # the adverb opens the (main) clause
  complement: Clause | None = None
  gap: str | None = None  # in a relative clause: 'subject' or 'object'


@dataclasses.dataclass(frozen=True)
class Sentence:
  """A main clause, optionally joined to a second clause.

  `link` is a key of CONJUNCTIONS (a second main clause) or of SUBORDINATORS (a
  subordinate clause, which comes first if `sub_first`).
  """
  main: Clause
  link: str | None = None
  second: Clause | None = None
  sub_first: bool = False
  question: bool = False


# ---------------------------------------------------------------------------------------
# Shared helpers.
# ---------------------------------------------------------------------------------------

def _gender_key(np: NounPhrase) -> str:
  return 'p' if np.plural else NOUNS[np.noun].gender


def _agreement_plural(clause: Clause, head: NounPhrase | None) -> bool:
  """Plural agreement: the subject's, or the head noun's in a subject-gap relative clause."""
  return (clause.subject or head).plural


def _finish(tokens: list[str], end: str) -> str:
  """Joins tokens, attaching punctuation and dropping commas that close nothing."""
  out: list[str] = []
  for tok in tokens:
    if tok == ',':
      if out and out[-1] != ',':
        out.append(tok)
    elif tok:
      out.append(tok)
  while out and out[-1] == ',':
    out.pop()
  text = ' '.join(out).replace(' ,', ',') + end
  return text[0].upper() + text[1:]


# ---------------------------------------------------------------------------------------
# English renderer.
# ---------------------------------------------------------------------------------------

def _en_np(np: NounPhrase) -> list[str]:
  noun = NOUNS[np.noun]
  det = DETERMINERS[np.det][1 if np.plural else 0]
  words = ([det] if det else []) + (['very'] if np.very else []) + list(np.adjectives)
  words.append(noun.en_pl if np.plural else noun.en)
  if det == 'a' and words[1][0] in 'aeiou':
    words[0] = 'an'
  if np.relative is not None:
    subject_gap = np.relative.gap == 'subject'
    pronoun = 'who' if subject_gap and 'person' in noun.tags else 'that'
    words += [pronoun] + _en_clause(np.relative, head=np)
  return words


def _en_pp(pp: PrepPhrase) -> list[str]:
  return [pp.prep] + _en_np(pp.np)


def _en_verb_group(c: Clause, plural: bool, question: bool) -> tuple[str | None, list[str]]:
  """(auxiliary, rest): a question puts the subject between them."""
  v = VERBS[c.verb]
  adverb = [c.adverb] if c.adverb and not c.fronted and ADVERBS[c.adverb][1] == 'freq' else []
  neg = ['not'] if c.negated else []
  do = 'do' if plural else 'does'
  if c.modal == 'want':
    if c.negated or question:
      return do, neg + ['want', 'to', v.en]
    return None, ['want' if plural else 'wants', 'to', v.en]
  if c.modal:
    return ('cannot' if c.negated else c.modal), [v.en]
  if c.tense == 'perfect':
    return ('have' if plural else 'has'), neg + adverb + [
        'been' if v.frame == 'cop' else v.en_part]
  if v.frame == 'cop':
    return ('are' if plural else 'is'), neg + adverb
  if c.negated or question:
    return do, neg + adverb + [v.en]
  return None, adverb + [v.en if plural else v.en_3sg]


def _en_complements(c: Clause) -> list[str]:
  """Everything after the verb group, in English order."""
  v = VERBS[c.verb]
  words: list[str] = []
  if c.recipient is not None and not c.to_recipient:
    words += _en_np(c.recipient)
  if c.obj is not None:
    words += _en_np(c.obj)
  if c.recipient is not None and c.to_recipient:
    words += ['to'] + _en_np(c.recipient)
  if c.predicate:
    words += (['very'] if c.very else []) + [c.predicate]
  if c.pp is not None:
    words += _en_pp(c.pp)
  if c.adverb and not c.fronted and ADVERBS[c.adverb][1] != 'freq':
    words.append(c.adverb)
  if v.frame == 'that':
    words += ['that'] + _en_clause(c.complement)
  return words


def _en_clause(c: Clause, *, question: bool = False, head: NounPhrase | None = None
               ) -> list[str]:
  """The clause in English; for a relative clause (head given) without the gapped NP."""
  aux, rest = _en_verb_group(c, _agreement_plural(c, head), question)
  subject = _en_np(c.subject) if c.subject is not None else []
  front = [c.adverb] if c.fronted else []
  if question:
    return [aux] + subject + rest + _en_complements(c)
  return front + subject + ([aux] if aux else []) + rest + _en_complements(c)


def render_english(s: Sentence) -> str:
  """The English sentence for a structure."""
  if s.question:
    return _finish(_en_clause(s.main, question=True), '?')
  main = _en_clause(s.main)
  if s.link is None:
    return _finish(main, '.')
  second = _en_clause(s.second)
  if s.sub_first:
    return _finish([s.link] + second + [','] + main, '.')
  return _finish(main + ([','] if s.link == 'but' else []) + [s.link] + second, '.')


# ---------------------------------------------------------------------------------------
# German renderer.
# ---------------------------------------------------------------------------------------

def _de_article(det: str, g: str, ci: int) -> tuple[str, dict[str, tuple[str, ...]]]:
  """The determiner's German form and the adjective endings it requires."""
  stem, kind = DETERMINERS[det][2], DETERMINERS[det][3]
  if kind == 'def':
    return _DER[g][ci], _WEAK
  if kind == 'derword':
    return stem + _STRONG[g][ci], _WEAK
  if kind == 'quantifier':
    return stem + _STRONG[g][ci], _STRONG
  if kind == 'einword':
    ending = _EIN[g][ci]
    # Where the ein-word shows no ending, the adjective carries the strong one.
    return stem + ending, (_STRONG if not ending else _WEAK)
  return stem, _STRONG  # bare nouns and numbers: the adjective shows the case


def _de_np_words(np: NounPhrase, case: str) -> tuple[list[str], str]:
  """German words of the NP without its relative clause, and the bare article form."""
  noun = NOUNS[np.noun]
  g, ci = _gender_key(np), CASES.index(case)
  article, endings = _de_article(np.det, g, ci)
  words = [article] if article else []
  if np.very:
    words.append('sehr')
  for adj in np.adjectives:
    words.append(ADJECTIVES[adj].de_stem + endings[g][ci])
  words.append(noun.german(case, np.plural))
  return words, article


def _de_np(np: NounPhrase, case: str, prep: str | None = None) -> list[str]:
  words, article = _de_np_words(np, case)
  if prep is not None:
    fused = _CONTRACTIONS.get((prep, article)) if np.det == 'the' else None
    words = [fused] + words[1:] if fused else [prep] + words
  if np.relative is not None:
    words += [','] + _de_relative(np.relative, np) + [',']
  return words


def _de_pp(pp: PrepPhrase) -> list[str]:
  de, case, _ = PREPOSITIONS[pp.prep]
  return _de_np(pp.np, case, de)


def _de_relative(c: Clause, head: NounPhrase) -> list[str]:
  case = 'nom' if c.gap == 'subject' else VERBS[c.verb].object_case
  pronoun = _RELATIVE[_gender_key(head)][CASES.index(case)]
  parts = _de_parts(c, head)
  return [pronoun] + parts.subject + parts.adverb + parts.middle + parts.final


@dataclasses.dataclass
class _GermanParts:
  """The topological fields of a German clause, to be ordered by clause type."""
  subject: list[str]
  adverb: list[str]
  middle: list[str]  # the rest of the middle field
  finite: str  # the finite verb in second/first position
  bracket: list[str]  # right bracket of a main clause
  final: list[str]  # verb cluster of a verb-final clause
  extraposed: list[str]  # the dass-clause, after the right bracket


def _de_verbs(c: Clause, plural: bool) -> tuple[str, list[str], list[str]]:
  """(finite verb for V1/V2, right bracket, verb-final cluster)."""
  v = VERBS[c.verb]
  if c.modal:
    finite = MODALS[c.modal][plural]
    return finite, [v.de_inf], [v.de_inf, finite]
  if c.tense == 'perfect':
    finite = {'haben': ('hat', 'haben'), 'sein': ('ist', 'sind')}[v.aux][plural]
    return finite, [v.de_part], [v.de_part, finite]
  finite = v.de_pl if plural else v.de_3sg
  return finite, ([v.prefix] if v.prefix else []), [v.prefix + finite]


def _keinify(np: NounPhrase) -> NounPhrase:
  """Negates an indefinite object: "does not see a dog" -> "sieht keinen Hund"."""
  return dataclasses.replace(np, det='no')


def _negates_object(c: Clause) -> bool:
  v = VERBS[c.verb]
  return (c.negated and c.obj is not None and v.frame in ('acc', 'dat', 'ditr')
          and c.obj.det in ('a', 'bare'))


def _de_middle(c: Clause) -> list[str]:
  """Objects, negation, PPs and predicate in German middle-field order."""
  v = VERBS[c.verb]
  keinified = _negates_object(c)
  objects = _de_np(c.recipient, 'dat') if c.recipient is not None else []
  complement: list[str] = []
  if c.obj is not None:
    obj = _keinify(c.obj) if keinified else c.obj
    if '.' in v.frame:  # a prepositional object is a complement, like a direction
      prep, case = v.frame.split('.')
      complement = _de_np(obj, case, prep)
    else:
      objects += _de_np(obj, v.object_case)
  adjunct: list[str] = []
  if c.pp is not None:
    if c.pp.prep in DIRECTIONAL or v.frame == 'cop':
      complement = _de_pp(c.pp) + complement
    else:
      adjunct = _de_pp(c.pp)
  if c.predicate:
    complement = (['sehr'] if c.very else []) + [ADJECTIVES[c.predicate].de]
  if not c.negated or keinified:
    return objects + adjunct + complement
  # "nicht" precedes complements (nicht auf den Bus, nicht müde, nicht in den Park) and
  # an adjunct PP of a clause without objects (nicht im Garten); else it ends the field.
  if complement:
    return objects + adjunct + ['nicht'] + complement
  return objects + ['nicht'] + adjunct


def _de_parts(c: Clause, head: NounPhrase | None = None) -> _GermanParts:
  plural = _agreement_plural(c, head)
  finite, bracket, final = _de_verbs(c, plural)
  extraposed: list[str] = []
  if c.complement is not None:
    sub = _de_parts(c.complement)
    # The closing comma separates the dass-clause from a following "und ...".
    extraposed = [',', 'dass'] + sub.subject + sub.adverb + sub.middle + sub.final + [',']
  return _GermanParts(
      subject=_de_np(c.subject, 'nom') if c.subject is not None else [],
      adverb=[ADVERBS[c.adverb][0]] if c.adverb and not c.fronted else [],
      middle=_de_middle(c), finite=finite, bracket=bracket, final=final,
      extraposed=extraposed)


def _de_main(c: Clause, *, verb_first: bool = False) -> list[str]:
  """A main clause: verb-second, or verb-first after a fronted subordinate clause."""
  p = _de_parts(c)
  if c.fronted:
    prefield = [ADVERBS[c.adverb][0]]
    rest = p.subject
  elif verb_first:
    prefield, rest = [], p.subject
  else:
    prefield, rest = p.subject, []
  return prefield + [p.finite] + rest + p.adverb + p.middle + p.bracket + p.extraposed


def _de_subordinate(c: Clause, conjunction: str) -> list[str]:
  """A verb-final subordinate clause introduced by `conjunction`."""
  p = _de_parts(c)
  return [conjunction] + p.subject + p.adverb + p.middle + p.final + p.extraposed


def translate(s: Sentence) -> str:
  """The German sentence for a structure (the reference translation of render_english)."""
  if s.question:
    return _finish(_de_main(s.main, verb_first=True), '?')
  if s.link is None:
    return _finish(_de_main(s.main), '.')
  if s.link in CONJUNCTIONS:
    comma = [','] if s.link == 'but' else []
    return _finish(_de_main(s.main) + comma + [CONJUNCTIONS[s.link]] +
                   _de_main(s.second), '.')
  sub = _de_subordinate(s.second, SUBORDINATORS[s.link])
  if s.sub_first:
    # The subordinate clause fills the prefield, so the main verb comes next.
    return _finish(sub + [','] + _de_main(s.main, verb_first=True), '.')
  return _finish(_de_main(s.main) + [','] + sub, '.')


def render_pair(s: Sentence) -> tuple[str, str]:
  """(English, German) for a structure."""
  return render_english(s), translate(s)


# ---------------------------------------------------------------------------------------
# Sampler: random structures with only the combinations the renderers handle correctly.
# ---------------------------------------------------------------------------------------

_NP_DETS = {
    # (role, plural) -> (determiners, weights)
    ('subject', False): (('the', 'a', 'this', 'my', 'our', 'his', 'her', 'every', 'no'),
                         (8, 4, 1, 1, .5, .5, .5, .4, .3)),
    ('object', False): (('the', 'a', 'this', 'my', 'our', 'his', 'her', 'no'),
                        (8, 4, 1, 1, .5, .5, .5, .3)),
    ('pp', False): (('the', 'a', 'this', 'my', 'our', 'his', 'her'),
                    (8, 3, 1, 1, .5, .5, .5)),
    ('subject', True): (('the', 'bare', 'this', 'my', 'our', 'his', 'her', 'many', 'some',
                         'no') + tuple(NUMBERS), (5, 3, 1, .7, .5, .4, .4, .6, .6, .3) +
                        (.2,) * len(NUMBERS)),
    ('pp', True): (('the', 'bare', 'this', 'my', 'our'), (5, 2, 1, .5, .5)),
    ('mass', False): (('the', 'bare', 'this', 'my', 'our', 'his', 'her'),
                      (5, 3, 1, 1, .5, .5, .5)),
}
_NP_DETS['object', True] = _NP_DETS['subject', True]
_FIXED_DETS = frozenset({'every', 'no', 'many', 'some'} | set(NUMBERS))


@functools.lru_cache(maxsize=None)
def _nouns_with(tags: frozenset[str]) -> tuple[str, ...]:
  return tuple(k for k, n in NOUNS.items() if n.tags & tags)


@functools.lru_cache(maxsize=None)
def _adjectives_for(noun: str) -> tuple[str, ...]:
  return tuple(k for k, a in ADJECTIVES.items() if a.tags & NOUNS[noun].tags)


def _sample_adjectives(rng: random.Random, noun: str) -> tuple[tuple[str, ...], bool]:
  r = rng.random()
  fitting = _adjectives_for(noun)
  if r < 0.62 or not fitting:
    return (), False
  first = rng.choice(fitting)
  adjectives = (first,)
  if r > 0.92:
    second = rng.choice(fitting)
    if ADJECTIVES[second].order != ADJECTIVES[first].order:
      adjectives = tuple(sorted((first, second), key=lambda a: ADJECTIVES[a].order))
  very = ADJECTIVES[adjectives[0]].gradable and rng.random() < 0.15
  return adjectives, very


def _sample_np(rng: random.Random, tags: frozenset[str], role: str) -> NounPhrase:
  """A noun phrase whose noun has one of `tags`; role is subject, object or pp."""
  key = rng.choice(_nouns_with(tags))
  noun = NOUNS[key]
  if 'name' in noun.tags:
    return NounPhrase(key, det='name')
  if 'mass' in noun.tags:
    plural = False
    dets, weights = _NP_DETS['mass', False]
  else:
    plural = rng.random() < 0.3
    dets, weights = _NP_DETS[role, plural]
  det = rng.choices(dets, weights)[0]
  adjectives, very = _sample_adjectives(rng, key)
  return NounPhrase(key, det, plural, adjectives, very)


@functools.lru_cache(maxsize=None)
def _verb_pool(kind: str, head_tags: frozenset[str] = frozenset()) -> tuple[str, ...]:
  """Verbs usable in a clause of this kind ('regular', 'cop', 'that', 'relsubj', 'relobj')."""
  if kind in ('cop', 'that'):
    return tuple(k for k, v in VERBS.items() if v.frame == kind)
  if kind == 'regular':
    return tuple(k for k, v in VERBS.items() if v.frame not in ('cop', 'that'))
  if kind == 'relsubj':
    return tuple(k for k, v in VERBS.items() if v.frame != 'that' and v.subj & head_tags)
  # Object relatives: English must not strand a preposition ("that the man waits for").
  return tuple(k for k, v in VERBS.items() if v.frame in ('acc', 'dat', 'ditr')
               and v.obj & head_tags and 'pres' not in v.flags)


def _sample_verb(rng: random.Random, kind: str, head: NounPhrase | None) -> str:
  if kind in ('relsubj', 'relobj'):
    return rng.choice(_verb_pool(kind, NOUNS[head.noun].tags))
  r = rng.random()
  if kind == 'main' and r < 0.12:
    return rng.choice(_verb_pool('that'))
  if r > 0.88:
    return 'be'
  return rng.choice(_verb_pool('regular'))


def _sample_tense(rng: random.Random, v: Verb, kind: str) -> tuple[str, str | None]:
  r = rng.random()
  relative = kind in ('relsubj', 'relobj')
  if r < 0.15 and not relative and not {'nomod', 'pres'} & v.flags:
    modal = rng.choice(('can', 'want') if kind == 'question' else ('can', 'must', 'want'))
    return 'present', modal
  if r < 0.45 and 'pres' not in v.flags:
    return 'perfect', None
  return 'present', None


def _sample_adverb(rng: random.Random, c: Clause, kind: str) -> Clause:
  if kind in ('relsubj', 'relobj') or rng.random() > 0.25:
    return c
  adverb = rng.choice(tuple(ADVERBS))
  category = ADVERBS[adverb][1]
  if ((category == 'time_future' and c.tense == 'perfect') or
      (category == 'freq' and c.modal)):
    return c
  frontable = kind == 'main' and adverb not in _UNFRONTABLE
  # A clause-final English time adverb after a that-clause would modify that clause.
  must_front = VERBS[c.verb].frame == 'that' and category != 'freq'
  if must_front and not frontable:
    return c
  fronted = frontable and (must_front or rng.random() < 0.4)
  return dataclasses.replace(c, adverb=adverb, fronted=fronted)


def _negation_ok(c: Clause) -> bool:
  """Whether the clause has an unambiguous, idiomatic negation in both languages."""
  v = VERBS[c.verb]
  if c.modal == 'must' or (c.adverb and ADVERBS[c.adverb][1] == 'freq'):
    return False  # "muss nicht" means "need not"; "oft nicht" is a different claim
  if c.subject is not None and c.subject.det in ('no', 'every'):
    return False
  for np in (c.obj, c.recipient):
    if np is not None and np.det in _FIXED_DETS:
      return False
  if c.recipient is not None and c.recipient.det in ('a', 'bare') and c.obj.det not in (
      'a', 'bare'):
    return False  # "does not give a child the book"
  has_objects = c.obj is not None and v.frame in ('acc', 'dat', 'ditr')
  adjunct = c.pp is not None and c.pp.prep not in DIRECTIONAL and v.frame != 'cop'
  # "sieht den Hund nicht im Park" would deny only the place.
  return not (has_objects and adjunct and not _negates_object(
      dataclasses.replace(c, negated=True)))


def _sample_pp(rng: random.Random, v: Verb, kind: str,
               subject: NounPhrase | None) -> PrepPhrase | None:
  if not v.pps or rng.random() > (0.2 if kind in ('relsubj', 'relobj') else 0.35):
    return None
  prep = rng.choice(v.pps)
  tags = frozenset(PREPOSITIONS[prep][2])
  np = _sample_np(rng, tags, 'pp')
  if subject is not None and np.noun == subject.noun:
    np = _sample_np(rng, tags, 'pp')  # "Peter plays with Peter"
  return PrepPhrase(prep, np)


def _sample_copula(rng: random.Random, subject: NounPhrase) -> dict:
  """Predicate of a copula clause: an adjective that fits the subject, or a place."""
  # "Is the warm milk warm?" says nothing: skip the subject's own adjectives.
  fitting = [a for a in _adjectives_for(subject.noun) if a not in subject.adjectives]
  if fitting and rng.random() < 0.75:
    predicate = rng.choice(fitting)
    return {'predicate': predicate,
            'very': ADJECTIVES[predicate].gradable and rng.random() < 0.2}
  prep = rng.choice(_PP_GROUPS['loc'])
  return {'pp': PrepPhrase(prep, _sample_np(rng, frozenset(PREPOSITIONS[prep][2]), 'pp'))}


def _sample_objects(rng: random.Random, v: Verb, kind: str,
                    subject: NounPhrase | None) -> dict:
  fields = {}
  if v.object_case and kind != 'relobj' and not ('opt' in v.flags and rng.random() < 0.3):
    # "spricht über keine Läden" is odd: prepositional objects get the PP determiners.
    role = 'pp' if '.' in v.frame else 'object'
    obj = _sample_np(rng, v.obj, role)
    if subject is not None and obj.noun == subject.noun:
      obj = _sample_np(rng, v.obj, role)  # "Peter thanks Peter" reads oddly
    fields['obj'] = obj
  if v.frame == 'ditr':
    recipient = _sample_np(rng, v.recipient, 'object')
    if subject is not None and recipient.noun == subject.noun:
      recipient = _sample_np(rng, v.recipient, 'object')
    fields['recipient'] = recipient
    fields['to_recipient'] = rng.random() < 0.4
  return fields


def _sample_clause(rng: random.Random, kind: str, head: NounPhrase | None = None) -> Clause:
  """kind: main, sub, complement, question, relsubj or relobj (head = the modified NP)."""
  key = _sample_verb(rng, kind, head)
  v = VERBS[key]
  tense, modal = _sample_tense(rng, v, kind)
  subject = None if kind == 'relsubj' else _sample_np(rng, v.subj, 'subject')
  fields = _sample_objects(rng, v, kind, subject)
  if v.frame == 'cop':
    fields.update(_sample_copula(rng, subject or head))
  else:
    fields['pp'] = _sample_pp(rng, v, kind, subject)
  if v.frame == 'that':
    fields['complement'] = _sample_clause(rng, 'complement')
  gap = {'relsubj': 'subject', 'relobj': 'object'}.get(kind)
  c = Clause(subject, key, tense=tense, modal=modal, gap=gap, **fields)
  c = _sample_adverb(rng, c, kind)
  if (kind not in ('question', 'relsubj', 'relobj') and rng.random() < 0.18 and
      _negation_ok(c)):
    c = dataclasses.replace(c, negated=True)
  return c


def _with_relative(rng: random.Random, np: NounPhrase) -> NounPhrase:
  tags = NOUNS[np.noun].tags
  kinds = [k for k in ('relobj', 'relsubj') if _verb_pool(k, tags)]
  if not kinds:
    return np
  kind = kinds[0] if rng.random() < 0.4 else kinds[-1]
  return dataclasses.replace(np, relative=_sample_clause(rng, kind, np))


def _relativizable(np: NounPhrase | None) -> bool:
  return np is not None and np.det in ('the', 'a', 'this', 'bare') and np.relative is None


def _maybe_relative(rng: random.Random, c: Clause, *, prefield_subject: bool) -> Clause:
  """Adds a relative clause where German needs no extraposition to keep it in place."""
  r = rng.random()
  if r < 0.10 and prefield_subject and not c.fronted and _relativizable(c.subject):
    return dataclasses.replace(c, subject=_with_relative(rng, c.subject))
  v = VERBS[c.verb]
  # The object must end the German clause: nothing may follow it in the middle field
  # or the right bracket, and no English time adverb may follow it.
  object_last = (v.frame in ('acc', 'dat', 'ditr') and not c.to_recipient and
                 c.tense == 'present' and not c.modal and not v.prefix and
                 not c.negated and c.pp is None and c.complement is None and
                 not (c.adverb and not c.fronted and ADVERBS[c.adverb][1] != 'freq'))
  if 0.10 <= r < 0.22 and object_last and _relativizable(c.obj):
    return dataclasses.replace(c, obj=_with_relative(rng, c.obj))
  return c


def sample_sentence(rng: random.Random) -> Sentence:
  """One random sentence structure (not length-filtered)."""
  r = rng.random()
  if r < 0.08:
    return Sentence(_sample_clause(rng, 'question'), question=True)
  main = _maybe_relative(rng, _sample_clause(rng, 'main'), prefield_subject=True)
  if r < 0.45:
    return Sentence(main)
  if r < 0.62:
    second = _maybe_relative(rng, _sample_clause(rng, 'main'), prefield_subject=True)
    return Sentence(main, rng.choice(tuple(CONJUNCTIONS)), second)
  second = _sample_clause(rng, 'sub')
  link = rng.choice(tuple(SUBORDINATORS))
  if link == 'when' and 'perfect' in (main.tense, second.tense):
    link = 'because'  # past events would need "als", not "wenn"
  if r < 0.82:
    return Sentence(main, link, second)
  # A fronted subordinate clause takes the prefield: no fronted adverb, no relative there.
  main = _sample_clause(rng, 'main')
  main = dataclasses.replace(main, fronted=False) if main.fronted else main
  return Sentence(main, link, second, sub_first=True)


MIN_WORDS, MAX_WORDS = 4, 30


def _pair_stream(rng: random.Random) -> Iterable[tuple[str, str]]:
  while True:
    en, de = render_pair(sample_sentence(rng))
    if MIN_WORDS <= en.count(' ') + 1 <= MAX_WORDS and de.count(' ') + 1 <= MAX_WORDS + 4:
      yield en, de


def generate_pairs(num_pairs: int, seed: int) -> list[tuple[str, str]]:
  """`num_pairs` (English, German) pairs, a deterministic function of `seed`."""
  stream = _pair_stream(random.Random(seed))
  return [next(stream) for _ in range(num_pairs)]


# ---------------------------------------------------------------------------------------
# Corpus files.
# ---------------------------------------------------------------------------------------

SPLITS = ('train', 'dev', 'test')
MARKER = 'corpus.json'


def split_pairs(num_train: int, num_dev: int, num_test: int, seed: int
                ) -> dict[str, list[tuple[str, str]]]:
  """Train, dev and test pairs; no English sentence of one split occurs in another."""
  train = generate_pairs(num_train, seed)
  seen = {en for en, _ in train}
  splits = {'train': train}
  for split, size in (('dev', num_dev), ('test', num_test)):
    # Own streams, so train does not change with the held-out sizes.
    stream = _pair_stream(random.Random(f'{seed}:{split}'))
    pairs: list[tuple[str, str]] = []
    while len(pairs) < size:
      pair = next(stream)
      if pair[0] not in seen:
        pairs.append(pair)
    seen.update(en for en, _ in pairs)
    splits[split] = pairs
  return splits


def _sha256(path: str) -> str:
  with open(path, 'rb') as f:
    return hashlib.sha256(f.read()).hexdigest()


def _atomic_write(path: str, text: str) -> None:
  """Writes via a temporary file in the same directory: readers never see half a file."""
  directory, name = os.path.split(path)
  fd, tmp = tempfile.mkstemp(prefix=f'.{name}.', suffix='.tmp', dir=directory)
  try:
    with os.fdopen(fd, 'w', encoding='utf-8', newline='\n') as f:
      f.write(text)
    os.chmod(tmp, 0o644)  # mkstemp's 0o600 would hide the corpus from other users
    os.replace(tmp, path)
  except BaseException:
    os.unlink(tmp)
    raise


def _is_current(directory: str, params: dict, names: Sequence[str]) -> bool:
  """Whether the marker matches `params` and the files still have their checksums."""
  try:
    with open(os.path.join(directory, MARKER), encoding='utf-8') as f:
      marker = json.load(f)
    return marker['params'] == params and all(
        _sha256(os.path.join(directory, n)) == marker['sha256'][n] for n in names)
  except (OSError, ValueError, KeyError, TypeError):
    return False


def write_corpus(directory: str, *, num_train: int = 50_000, num_dev: int = 1000,
                 num_test: int = 1000, seed: int = 0, source_lang: str = 'en',
                 target_lang: str = 'de') -> dict[str, str]:
  """Writes <directory>/{train,dev,test}.{source_lang,target_lang}; returns the prefixes.

  Skips the work if a marker (corpus.json) shows the files were written with the same
  parameters and generator version and are unchanged since.
  """
  prefixes = {split: os.path.join(directory, split) for split in SPLITS}
  names = [f'{split}.{lang}' for split in SPLITS for lang in (source_lang, target_lang)]
  params = {'generator_version': GENERATOR_VERSION, 'num_train': num_train,
            'num_dev': num_dev, 'num_test': num_test, 'seed': seed,
            'source_lang': source_lang, 'target_lang': target_lang}
  if _is_current(directory, params, names):
    return prefixes
  os.makedirs(directory, exist_ok=True)
  checksums = {}
  for split, pairs in split_pairs(num_train, num_dev, num_test, seed).items():
    for lang, side in ((source_lang, 0), (target_lang, 1)):
      path = f'{prefixes[split]}.{lang}'
      _atomic_write(path, ''.join(pair[side] + '\n' for pair in pairs))
      checksums[os.path.basename(path)] = _sha256(path)
  # The marker goes last: a crash before this point leaves no marker to trust.
  _atomic_write(os.path.join(directory, MARKER),
                json.dumps({'params': params, 'sha256': checksums}, indent=2) + '\n')
  return prefixes


def corpus_stats(pairs: Sequence[tuple[str, str]]) -> dict[str, float]:
  """Distinct word types and mean words per sentence on each side (punctuation excluded)."""
  stats = {}
  for lang, side in (('en', 0), ('de', 1)):
    counts = collections.Counter()
    total = 0
    for pair in pairs:
      words = re.findall(r'\w+', pair[side])
      counts.update(words)
      total += len(words)
    stats[f'{lang}_types'] = len(counts)
    stats[f'{lang}_mean_words'] = total / max(len(pairs), 1)
  return stats


def _read_pairs(prefix: str, source_lang: str, target_lang: str) -> list[tuple[str, str]]:
  with open(f'{prefix}.{source_lang}', encoding='utf-8') as src, open(
      f'{prefix}.{target_lang}', encoding='utf-8') as tgt:
    return [(s.rstrip('\n'), t.rstrip('\n')) for s, t in zip(src, tgt)]


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--out', required=True, help='directory for the corpus files')
  parser.add_argument('--num_train', type=int, default=50_000)
  parser.add_argument('--num_dev', type=int, default=1000)
  parser.add_argument('--num_test', type=int, default=1000)
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--samples', type=int, default=8, help='sample pairs to print')
  args = parser.parse_args(argv)
  start = time.perf_counter()
  prefixes = write_corpus(args.out, num_train=args.num_train, num_dev=args.num_dev,
                          num_test=args.num_test, seed=args.seed)
  print(f'corpus in {args.out} ({time.perf_counter() - start:.1f} s): '
        + ', '.join(f'{split} {prefix}.{{en,de}}' for split, prefix in prefixes.items()))
  train = _read_pairs(prefixes['train'], 'en', 'de')
  stats = corpus_stats(train)
  print(f'train: {len(train)} pairs; word types en {stats["en_types"]}, '
        f'de {stats["de_types"]}; mean words per sentence en {stats["en_mean_words"]:.1f}, '
        f'de {stats["de_mean_words"]:.1f}')
  for en, de in random.Random(args.seed).sample(train, min(args.samples, len(train))):
    print(f'  EN: {en}\n  DE: {de}')


if __name__ == '__main__':
  main()
