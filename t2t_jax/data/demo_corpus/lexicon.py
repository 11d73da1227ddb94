"""The demo corpus's words: nouns, adjectives, verbs and the closed word classes.

English and German forms of every word, with the tags that say what may combine: nouns,
adjectives and verbs as '|'-separated tables, parsed once at import into `NOUNS`,
`ADJECTIVES` and `VERBS`; prepositions, adverbs, modals, determiners and conjunctions as
dicts. Data only: grammar.py renders it, sampling.py draws from it.
"""
# A verb table row is one line, however wide, so that its columns can be read across.
# ruff: noqa: E501
from __future__ import annotations

import dataclasses

# ---------------------------------------------------------------------------------- tables
# Columns are separated by '|'; tags by ','. Kept as tables so that a reader can check the
# German at a glance.

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


# --------------------------------------------------------------------- closed word classes

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
PP_GROUPS = {
    'loc': ('in', 'on', 'under', 'behind', 'in front of', 'next to', 'at'),
    'with': ('with', 'without'),
    'dir': ('into', 'to', 'through', 'across'),
}
# Directional PPs and prepositional objects are complements: "nicht" precedes them.
DIRECTIONAL = frozenset({'into', 'onto', 'to', 'through', 'across', 'from'})

# english -> (German, kind). time_* adverbs go clause-final in English, freq ones before
# the main verb; both go right after the subject in the German middle field. No
# "yesterday": the English present perfect, which renders the Perfekt, rejects it.
ADVERBS = {
    'today': ('heute', 'time_any'), 'tomorrow': ('morgen', 'time_future'),
    'now': ('jetzt', 'time_future'),
    'often': ('oft', 'freq'), 'sometimes': ('manchmal', 'freq'),
    'usually': ('meistens', 'freq'), 'always': ('immer', 'freq'),
}

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
DETERMINERS.update((en, (None, en, de, 'none')) for en, de in NUMBERS.items())

CONJUNCTIONS = {'and': 'und', 'or': 'oder', 'but': 'aber'}
SUBORDINATORS = {'because': 'weil', 'although': 'obwohl', 'when': 'wenn', 'while': 'während'}


# -------------------------------------------------------------------------- parsed entries

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
    if '.' in self.frame:
      return self.frame.split('.')[1]
    return {'acc': 'acc', 'ditr': 'acc', 'dat': 'dat'}.get(self.frame)


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
    pp_list = [pp for group in pps.split(',') if group != '-'
               for pp in PP_GROUPS.get(group, (group,))]
    verbs[key] = Verb(key, en_base, en_3sg, en_part, de_inf.replace('+', ''), de_3sg, de_pl,
                      de_part, prefix, 'sein' if aux == 's' else 'haben', frame,
                      _tagset(subj), _tagset(obj), _tagset(recipient), tuple(pp_list),
                      frozenset(flags.split(',')) - {''})
  return verbs


NOUNS = _parse_nouns(_NOUN_TABLE)
ADJECTIVES = _parse_adjectives(_ADJECTIVE_TABLE)
VERBS = _parse_verbs(_VERB_TABLE)
